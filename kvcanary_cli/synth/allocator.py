"""The allocator simulation behind every synthetic dump: SGLang's pools as docs/semantics.md
§2-§3 describe them, for `synth.state` (one state) and `synth.sequence` (a serving loop).

- `RowPool`, the request-to-token pool: a `req_to_token` table whose rows are handed out
  last-freed first (row 0 reserved for padding) and left as they are when freed (stale tails);
- `FullPool`, the full KV pool's page allocator: pages from a first-in first-out free list
  (page 0 reserved), each page counted once per request holding it, so that a radix-shared
  page goes back only when its last holder finishes;
- `SwaPool`, the SWA pool and the LUT from full slots to SWA slots: length
  `num_full_slots + 1` with a trailing -1, 0 for an unmapped slot, full pages mapped to SWA
  pages offset for offset (pages in lockstep).

Work is per page or per request (numpy slices), never per token. Free lists hold pages; a
dump lists slots (`expand`).
"""

from __future__ import annotations

import numpy as np

from kvcanary_cli.dump.tensor import distinct

__all__ = ["FullPool", "PageFreeList", "RowPool", "SwaPool", "expand", "page_slots", "slots_at"]


def page_slots(pages: np.ndarray, page_size: int) -> np.ndarray:
    """The slots of `pages`, page by page in their order (a full page's tokens and its SWA
    page's line up offset for offset)."""
    offsets = np.arange(page_size, dtype=np.int64)
    return (np.asarray(pages, np.int64)[:, None] * page_size + offsets).reshape(-1)


def expand(pages: np.ndarray, page_size: int) -> np.ndarray:
    """Pages to the slots they hold, sorted (the dump lists free slots, not pages)."""
    return np.sort(page_slots(pages, page_size))


def slots_at(pages: np.ndarray, start: int, stop: int, page_size: int) -> np.ndarray:
    """The slots of positions `[start, stop)` of a request holding `pages` in position order."""
    positions = np.arange(start, stop, dtype=np.int64)
    slots: np.ndarray = pages[positions // page_size] * page_size + positions % page_size
    return slots


class PageFreeList:
    """A first-in first-out free list of page ids: allocate from the front, free to the back.

    The initial order is `1 .. num_pages - 1` (page 0 is reserved), shuffled by `rng` when
    given (as a serving engine's list is after some churn). It holds up to `num_pages + 1`
    pages, so that a planted double free fits."""

    def __init__(self, num_pages: int, rng: np.random.Generator | None = None) -> None:
        pages = np.arange(1, num_pages, dtype=np.int64)
        if rng is not None:
            rng.shuffle(pages)
        self._buf = np.zeros(num_pages + 2, dtype=np.int64)
        self._buf[: pages.size] = pages
        self._head = 0
        self._size = int(pages.size)

    def __len__(self) -> int:
        return self._size

    def _at(self, start: int, count: int) -> np.ndarray:
        return (start + np.arange(count, dtype=np.int64)) % self._buf.size

    def alloc(self, count: int) -> np.ndarray:
        """The `count` pages at the front, taken off the list."""
        if count > self._size:
            raise RuntimeError(f"synthetic pool exhausted: {count} pages asked, {self._size} free")
        pages: np.ndarray = self._buf[self._at(self._head, count)].copy()
        self._head = (self._head + count) % self._buf.size
        self._size -= count
        return pages

    def free(self, pages: np.ndarray) -> None:
        """Put `pages` at the back, in their order."""
        pages = np.asarray(pages, dtype=np.int64)
        if self._size + pages.size > self._buf.size:
            raise RuntimeError("synthetic free list overflows")
        self._buf[self._at(self._head + self._size, pages.size)] = pages
        self._size += int(pages.size)

    def unget(self, pages: np.ndarray) -> None:
        """Put pages back at the front (an allocation undone)."""
        pages = np.asarray(pages, dtype=np.int64)
        self._head = (self._head - pages.size) % self._buf.size
        self._buf[self._at(self._head, pages.size)] = pages
        self._size += int(pages.size)

    def contents(self) -> np.ndarray:
        """The free pages, front first (a view of the list's own buffer: copy to keep)."""
        listed: np.ndarray = self._buf[self._at(self._head, self._size)]
        return listed


class RowPool:
    """SGLang's request-to-token pool: the `req_to_token` table and its free rows, handed out
    last-freed first; row 0 is the padding row, never handed out. A freed row keeps its cells."""

    def __init__(self, max_reqs: int, max_seq_len: int) -> None:
        self.table = np.zeros((max_reqs, max_seq_len), dtype=np.int32)
        self._free = list(range(1, max_reqs))

    def __len__(self) -> int:
        """Rows free."""
        return len(self._free)

    def take(self) -> int:
        """A free row, the last freed first."""
        return self._free.pop()

    def give_back(self, row: int) -> None:
        """A finished request's row, cells left as they are."""
        self._free.append(row)

    def free_rows(self) -> list[int]:
        """The free rows, in list order (SGLang's `ReqToTokenPool.free_slots`)."""
        return list(self._free)


class FullPool:
    """The full KV pool's pages: a free list and, per page, how many requests hold it."""

    def __init__(self, num_pages: int, page_size: int, rng: np.random.Generator | None) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.free = PageFreeList(num_pages, rng)
        self.refcount = np.zeros(num_pages, dtype=np.int64)

    @property
    def num_slots(self) -> int:
        """The pool's size in slots (its reserved page included)."""
        return self.num_pages * self.page_size

    def alloc(self, count: int) -> np.ndarray:
        """`count` pages off the free list, held once."""
        pages = self.free.alloc(count)
        self.refcount[pages] += 1
        return pages

    def hold(self, pages: np.ndarray) -> None:
        """One more holder for `pages` (a radix-shared prefix)."""
        self.refcount[pages] += 1

    def release(self, pages: np.ndarray) -> None:
        """One holder fewer for `pages`; the ones nobody holds any more go back on the list."""
        self.refcount[pages] -= 1
        self.free.free(distinct(pages[self.refcount[pages] == 0]))

    def undo(self, pages: np.ndarray) -> None:
        """An allocation of `pages` undone: unheld, back at the front of the list."""
        self.refcount[pages] -= 1
        self.free.unget(pages)

    def forget(self, pages: np.ndarray) -> None:
        """One holder fewer for `pages`, and none of them freed (an orphaning fault)."""
        self.refcount[pages] -= 1

    def held(self) -> np.ndarray:
        """The pages some request holds, ascending."""
        return np.flatnonzero(self.refcount > 0)

    def free_slots(self) -> np.ndarray:
        """The free list as the dump records it (`free_full_slots`)."""
        return expand(self.free.contents(), self.page_size)


class SwaPool:
    """The SWA pool's pages and the LUT that maps full slots into them."""

    def __init__(
        self, num_pages: int, num_full_slots: int, page_size: int, rng: np.random.Generator
    ) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.free = PageFreeList(num_pages, rng)
        self.lut = np.zeros(num_full_slots + 1, dtype=np.int64)
        self.lut[-1] = -1

    @property
    def num_slots(self) -> int:
        """The pool's size in slots (its reserved page included)."""
        return self.num_pages * self.page_size

    def map(self, full_pages: np.ndarray) -> np.ndarray:
        """Give `full_pages` SWA pages off the free list, in their order; returns those."""
        swa = self.free.alloc(int(np.asarray(full_pages).size))
        self.point(full_pages, swa)
        return swa

    def point(self, full_pages: np.ndarray, swa_pages: np.ndarray) -> None:
        """Map `full_pages` onto `swa_pages`, offset for offset."""
        p = self.page_size
        self.lut[page_slots(full_pages, p)] = page_slots(swa_pages, p)

    def clear(self, full_pages: np.ndarray) -> None:
        """Unmap `full_pages` (their SWA pages are not freed: `release` them)."""
        self.lut[page_slots(full_pages, self.page_size)] = 0

    def release(self, swa_pages: np.ndarray) -> None:
        """SWA pages back on the free list."""
        self.free.free(swa_pages)

    def free_slots(self) -> np.ndarray:
        """The free list as the dump records it (`free_swa_slots`)."""
        return expand(self.free.contents(), self.page_size)
