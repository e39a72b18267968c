"""`ranks`: one step's dumps of every tensor-parallel rank, compared (`kvcanary ranks`).

TP ranks run the same scheduler on the same broadcast requests, and SGLang sizes their pools
by the MIN over ranks and allocates as a pure function of the alloc/free stream, so a correct
rank holds the reference's bookkeeping exactly, slot ids included: a rank whose prefix is a
page shorter computes a different batch and deadlocks the next all-reduce. Each rank is
compared with the first, in the order that names a divergence nearest its cause: the pools'
sizes, the batch size, each batch row's request (pool row, prefix and extend lengths), the
req_to_token cells the batch uses, the free lists (contents, then order: the next
allocation), the slots the radix tree holds (a value set: a rank whose tree evicted a node
the others keep matches the next prefix a page shorter), the SWA LUT.

Identity comes from the headers before any tensor is read: dumps of different steps or
models, or two dumps of one rank, are bad input. Work and memory follow what is compared: the
batch's rows up to their lengths, gathered `_CELLS` cells at a time (never the 2 GB table),
the free lists and the LUT in pieces.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvcanary_cli.dump.header import read_header_and_step, refuse_other_engine
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.schema import parse_integer
from kvcanary_cli.dump.tensor import difference
from kvcanary_cli.errors import DumpError, OptionError
from kvcanary_cli.results.ranks import (
    ComparedPart,
    Divergence,
    DivergenceKind,
    RankDump,
    RanksReport,
)
from kvcanary_cli.safe_text import excerpt

__all__ = ["compare_ranks"]

PathLike = str | os.PathLike[str]
#: req_to_token cells gathered per side at a time (32 MiB of int64 each).
_CELLS = 1 << 22
#: LUT entries read per side at a time.
_LUT_PIECE = 1 << 20
_SIZES = ("page_size", "num_full_slots", "num_swa_slots")
_REQUEST_FIELDS = ("req_pool_indices", "prefix_lens", "extend_seq_lens")
_FREE_LISTS: tuple[ComparedPart, ...] = ("free_full_slots", "free_swa_slots")


@dataclass(frozen=True, kw_only=True)
class _Entry:
    """A dump before it is loaded: what its header says."""

    path: str
    label: str
    step: int | None
    model: str | None


def compare_ranks(
    paths: Sequence[PathLike], *, overrides: Mapping[str, int | str | None] | None = None
) -> RanksReport:
    """Compare the dumps of one step's ranks with the first (in rank order)."""
    if len(paths) < 2:
        raise OptionError(
            "give two dumps or more, of one step", option="paths", hint="one per rank"
        )
    entries = _ordered(paths)
    reference = load_dump(entries[0].path, overrides=overrides)
    page = max(reference.scalar("page_size") or 1, 1)
    rows = [
        RankDump(
            rank=entries[0].label,
            path=entries[0].path,
            identity=reference.identity,
            divergence=None,
            compared=(),
            table_cells=0,
        )
    ]
    notes: list[str] = []
    for entry in entries[1:]:
        other = load_dump(entry.path, overrides=overrides)
        pair = _Pair(reference, other, entries[0].label, entry.label, page)
        divergence = pair.first_divergence()
        rows.append(
            RankDump(
                rank=entry.label,
                path=entry.path,
                identity=other.identity,
                divergence=divergence,
                compared=tuple(pair.compared),
                table_cells=pair.cells,
            )
        )
        notes.extend(f"rank {entry.label}: {note}" for note in pair.notes)
    return RanksReport(
        step=entries[0].step,
        model=next((e.model for e in entries if e.model is not None), None),
        reference=entries[0].label,
        ranks=tuple(rows),
        notes=tuple(notes),
    )


def _ordered(paths: Sequence[PathLike]) -> list[_Entry]:
    """The dumps by rank (command-line order unless every rank is a number), from their
    headers alone; different steps or models, or one rank twice, are refused."""
    entries = []
    for i, path in enumerate(paths, 1):
        header, step = read_header_and_step(path)
        meta = header.metadata
        refuse_other_engine(meta, path)
        rank = meta.get("rank")
        label = rank.strip() if rank is not None else f"#{i}"
        entries.append(_Entry(path=str(path), label=label, step=step, model=meta.get("model")))
    first = entries[0]
    for e in entries[1:]:
        if e.step != first.step:
            mine = "no step" if e.step is None else f"step {e.step}"
            theirs = "none" if first.step is None else f"step {first.step}"
            raise DumpError(
                f"records {mine}, {first.path} {theirs}: ranks compares one step's dumps",
                field="step",
                path=e.path,
                hint="give the dumps every rank wrote at one step",
            )
        if e.model is not None and first.model is not None and e.model != first.model:
            raise DumpError(
                f"records model {excerpt(e.model)}, {first.path} model "
                f"{excerpt(first.model)}: the ranks of one server run one model",
                field="model",
                path=e.path,
                hint="give the dumps of one server",
            )
    seen: dict[str, str] = {}
    for e in entries:
        if e.label in seen:
            raise DumpError(
                f"records rank {excerpt(e.label)}, as {seen[e.label]} does: two dumps of one rank",
                field="rank",
                path=e.path,
                hint="give one dump per rank",
            )
        seen[e.label] = e.path
    numbers = [parse_integer(e.label) for e in entries]
    if all(n is not None for n in numbers):
        entries = [
            e for _, e in sorted(zip(numbers, entries, strict=True), key=lambda p: p[0] or 0)
        ]
    return entries


class _Pair:
    """The reference and one rank, compared in the order that names a divergence nearest
    its cause; `compared`, `notes` and `cells` say what was."""

    def __init__(self, ref: KvDump, other: KvDump, ref_rank: str, rank: str, page: int) -> None:
        self.ref, self.other, self.page = ref, other, page
        self.ref_rank, self.rank = ref_rank, rank
        self.compared: list[ComparedPart] = []
        self.notes: list[str] = []
        self.cells = 0

    def first_divergence(self) -> Divergence | None:
        steps = (self._sizes, self._batch, self._table, self._free_lists, self._tree, self._lut)
        for step in steps:
            found = step()
            if found is not None:
                return found
        return None

    def _both(self, a: object, b: object) -> str:
        return f"{a} on rank {self.ref_rank}, {b} on rank {self.rank}"

    def _diverged(
        self, kind: DivergenceKind, field: str, message: str, **at: int | None
    ) -> Divergence:
        where = {k: at.get(k) for k in ("batch_row", "pool_row", "position", "page", "slot")}
        return Divergence(
            kind=kind,
            field=field,
            reference_value=at.get("reference_value"),
            value=at.get("value"),
            message=message,
            **where,
        )

    def _sizes(self) -> Divergence | None:
        self.compared.append("sizes")
        ref, other = self.ref, self.other
        sizes = [(name, ref.scalar(name), other.scalar(name)) for name in _SIZES]
        sizes += [
            ("req_to_token rows", ref.max_reqs, other.max_reqs),
            ("req_to_token columns", ref.max_seq_len, other.max_seq_len),
            ("full_to_swa_index_mapping length", ref.lut_len, other.lut_len),
        ]
        for name, a, b in sizes:
            if a is not None and b is not None and a != b:
                return self._diverged(
                    "pool-size",
                    name,
                    f"{name}: {self._both(a, b)}: SGLang sizes every rank's pools alike",
                    reference_value=a,
                    value=b,
                )
        return None

    def _batch(self) -> Divergence | None:
        self.compared.append("batch")
        ref, other = self.ref, self.other
        if ref.bs != other.bs:
            return self._diverged(
                "batch-size",
                "req_pool_indices",
                f"batch size {self._both(ref.bs, other.bs)}",
                reference_value=ref.bs,
                value=other.bs,
            )
        firsts = []
        for name in _REQUEST_FIELDS:
            differ = np.flatnonzero(getattr(ref, name) != getattr(other, name))
            if differ.size:
                firsts.append((int(differ[0]), name))
        if not firsts:
            return None
        row, name = min(firsts, key=lambda f: (f[0], _REQUEST_FIELDS.index(f[1])))
        return self._request(row, name)

    def _request(self, row: int, name: str) -> Divergence:
        """Batch row `row` differs in `name`: where the two requests part."""
        a, b = int(getattr(self.ref, name)[row]), int(getattr(self.other, name)[row])
        pool_row = int(self.ref.req_pool_indices[row])
        head = f"batch row {row} (pool row {pool_row}): {name} {self._both(a, b)}"
        position = page = None
        if name == "req_pool_indices":
            message = f"batch row {row}: pool row {self._both(a, b)}"
        else:
            start = 0 if name == "prefix_lens" else int(self.ref.prefix_lens[row])
            position = start + min(a, b)
            page = position // self.page
            pages = abs(a - b) / self.page
            size = f"{pages:g} page{'s' if pages != 1 else ''}" if self.page > 1 else ""
            tokens = f"{abs(a - b)} token{'s' if abs(a - b) != 1 else ''}"
            what = "prefixes" if name == "prefix_lens" else "writes"
            message = (
                f"{head}: {tokens}{f' ({size})' if size else ''} apart; the {what} part at "
                f"position {position}, page {page}"
            )
        return self._diverged(
            "request",
            name,
            message,
            batch_row=row,
            pool_row=pool_row,
            position=position,
            page=page,
            reference_value=a,
            value=b,
        )

    def _table(self) -> Divergence | None:
        """The req_to_token cells each live batch row uses, `[0, prefix + extend)`."""
        ref, other = self.ref, self.other
        pool_rows = ref.req_pool_indices
        lengths = np.clip(ref.prefix_lens + ref.extend_seq_lens, 0, ref.max_seq_len)
        live = np.flatnonzero((pool_rows > 0) & (pool_rows < ref.max_reqs) & (lengths > 0))
        self.compared.append("req_to_token")
        unknown = 0
        for chunk in _chunks(live, lengths):
            width = int(lengths[chunk].max())
            a, known_a = ref.req_to_token.rows(pool_rows[chunk], width)
            b, known_b = other.req_to_token.rows(pool_rows[chunk], width)
            keep = known_a & known_b
            unknown += int(np.count_nonzero(~keep))
            used = np.arange(width)[None, :] < lengths[chunk][:, None]
            used &= keep[:, None]
            self.cells += int(np.count_nonzero(used))
            differ = np.flatnonzero((a != b) & used)
            if differ.size:
                i, position = divmod(int(differ[0]), width)
                row, pool_row = int(chunk[i]), int(pool_rows[chunk[i]])
                slot_a, slot_b = int(a[i, position]), int(b[i, position])
                return self._diverged(
                    "table",
                    "req_to_token",
                    f"batch row {row} (pool row {pool_row}), position {position} (page "
                    f"{position // self.page}): slot {self._both(slot_a, slot_b)}",
                    batch_row=row,
                    pool_row=pool_row,
                    position=position,
                    page=position // self.page,
                    reference_value=slot_a,
                    value=slot_b,
                )
        if unknown:
            self.notes.append(
                f"{unknown} batch rows not compared: a shrunk dump does not keep all their cells"
            )
        return None

    def _free_lists(self) -> Divergence | None:
        for name in _FREE_LISTS:
            a, b = getattr(self.ref, name), getattr(self.other, name)
            if a is None and b is None:
                continue
            if a is None or b is None:
                self.notes.append(f"{name} not compared: only some dumps record it")
                continue
            self.compared.append(name)
            found = self._free_list(name, a, b)
            if found is not None:
                return found
        return None

    def _tree(self) -> Divergence | None:
        a, b = self.ref.tree_full_slots, self.other.tree_full_slots
        if a is None and b is None:
            return None
        if a is None or b is None:
            self.notes.append("tree_full_slots not compared: only some dumps record it")
            return None
        self.compared.append("tree_full_slots")
        a, b = np.sort(a), np.sort(b)  # a set: the order is the walk's, not the allocator's
        return self._free_list("tree_full_slots", a, b, kind="tree", held="held by the tree")

    def _free_list(
        self,
        name: str,
        a: np.ndarray,
        b: np.ndarray,
        *,
        kind: DivergenceKind = "free-list",
        held: str = "free",
    ) -> Divergence | None:
        if a.shape == b.shape and np.array_equal(a, b):
            return None
        sa, sb = np.sort(a), np.sort(b)
        sizes = {"reference_value": int(a.size), "value": int(b.size)}
        counts = self._both(f"{a.size} slots", f"{b.size} slots")
        only_a, only_b = difference(sa, sb), difference(sb, sa)
        if only_a.size or only_b.size:
            in_a = only_a.size and (not only_b.size or only_a[0] < only_b[0])
            slot = int(only_a[0] if in_a else only_b[0])
            on, off = (self.ref_rank, self.rank) if in_a else (self.rank, self.ref_rank)
            message = (
                f"slot {slot} (page {slot // self.page}) is {held} on rank {on}, not on rank {off}"
            )
        elif sa.size != sb.size:
            longer = sa if sa.size > sb.size else sb
            slot = int(longer[np.flatnonzero(longer[1:] == longer[:-1])[0]])
            on = self.ref_rank if longer is sa else self.rank
            message = f"slot {slot} (page {slot // self.page}) is listed twice on rank {on}"
        else:
            i = int(np.flatnonzero(a != b)[0])
            slot = int(a[i])
            return self._diverged(
                "free-list",
                name,
                f"the same free slots in another order: entry {i} is slot "
                f"{self._both(int(a[i]), int(b[i]))}: the next allocation differs",
                page=slot // self.page,
                slot=slot,
                reference_value=int(a[i]),
                value=int(b[i]),
            )
        return self._diverged(
            kind,
            name,
            f"{name}: {message} ({counts})",
            page=slot // self.page,
            slot=slot,
            **sizes,
        )

    def _lut(self) -> Divergence | None:
        a, b = self.ref.full_to_swa_index_mapping, self.other.full_to_swa_index_mapping
        if a is None and b is None:
            return None
        if a is None or b is None:
            self.notes.append("full_to_swa_index_mapping not compared: only some dumps record it")
            return None
        self.compared.append("lut")
        for start in range(0, int(a.shape[0]), _LUT_PIECE):
            index = np.arange(start, min(start + _LUT_PIECE, int(a.shape[0])), dtype=np.int64)
            va, ka = a.take_known(index)
            vb, kb = b.take_known(index)
            differ = np.flatnonzero((va != vb) & ka & kb)
            if differ.size:
                i = int(differ[0])
                slot = int(index[i])
                return self._diverged(
                    "lut",
                    "full_to_swa_index_mapping",
                    f"LUT[{slot}] (page {slot // self.page}): SWA slot "
                    f"{self._both(int(va[i]), int(vb[i]))}",
                    page=slot // self.page,
                    slot=slot,
                    reference_value=int(va[i]),
                    value=int(vb[i]),
                )
        return None


def _chunks(rows: np.ndarray, lengths: np.ndarray) -> Iterator[np.ndarray]:
    """Batch rows in groups whose gather (rows x the longest length) is at most `_CELLS`
    cells (one row at a time when a row alone is longer)."""
    if rows.size == 0:
        return
    per = max(_CELLS // max(int(lengths[rows].max()), 1), 1)
    for start in range(0, rows.size, per):
        yield rows[start : start + per]
