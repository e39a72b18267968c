"""Benchmark: mutation testing of `kvcanary soak` against SGLang 0.5.23's own memory-cache code
(each memory layout soak drives) and vLLM 0.33.0's block pool (the snippets are those releases';
a vLLM mutant also carries the spellings of the releases 0.14.0 - 0.34.0 that write the same code
otherwise; on another vLLM release, `--vllm-wheel`, a mutant whose code it lacks is left out,
named).

Each mutant is one realistic bug planted in a copy of the release tree (a leak, a double free,
a free of the wrong range at a page boundary, a stale SWA mapping, a lock that does not cover
the window, a locked node evicted, a req_to_token row leaked, a lock never released on
retraction; in unified memory's code a virtual page freed but left bound, or freed on the full
side only, a compaction range one page short, a tombstoned page freed again, a page never
bound on the SWA side; in the Mamba layout's code slot 0 handed out, an evicted state kept by
its node, the row map not written, one slot given to two owners, a slot never freed; with the
extra buffer a request's track slots never freed, a track slot freed while the tree holds it,
a donated track slot not replaced, the track map left stale; in the radix sessions' code a
close that frees a tagged leaf's KV left in the tree, a tag that locks its path, a close that
keeps its references; under `soak --tp 2` the tree's access stamps ticking coarsely, so an
eviction tie parts the ranks; under `soak --tp 2 --hicache` a rank taking the write-through
acks its own copies finished, not the group's MIN; under `soak --tp 2 --hicache
--hicache-storage` a rank taking the storage hits its own store holds, not the group's MIN;
under `soak --overlap` a decode's SWA eviction that does not wait for the prefill in flight,
a request read as finished by the queued result one token early; under `soak --tp 2
--overlap` the coarse access stamps again, and under `soak --session-radix-cache --overlap`
the radix sessions' mutants again);
each
control is an edit that changes the code but not what it does. A mutant is a text edit:
(file, old snippet, new snippet, what it plants, the layout it is soaked under), applied at
run time to a hard-linked copy of the unpacked release (the edited file is replaced, never
written through its link; nothing of SGLang's is kept in this repository), and an edit whose
snippet is not found exactly once fails loudly.

Each variant is then run in one child process (SGLang imported once), per seed, on the same
seeded histories:
- the soak, as `kvcanary soak --sglang-tree COPY --layout L --steps N --seed S` runs it (the
  command's `soak()`, shrinking and writing its files included): the steps run until its
  finding;
- SGLang's own checks alone, with no kvcanary audit (the same stack shapes, workloads and
  serving options; SGLang's busy checks after every step, its idle checks at idle): the
  steps run until their first complaint, or SGLang's crash.
Each layout's release is run too (`release`, `unified-release`, `mamba-release`,
`mamba-extra-release`, `swa+radix-release`: the SWA layout under radix sessions,
`soak --session-radix-cache`, whose mutants are the radix sessions' code, and
`swa-tp2-release`: the SWA layout on two ranks, `swa+hicache-tp2-release`: with the host
tier too, `swa+hicache-storage-tp2-release`: with the storage tier behind it, and
`swa-overlap-release`: the SWA layout under SGLang's overlapped loop, `soak --overlap`, on both
sides, `swa-tp2-overlap-release`: on two ranks, and `swa+radix-overlap-release`: with radix
sessions).

A vLLM mutant (the block pool's frees, its free queue, the managers' and the coordinator's
frees, the prefix-cache map) is planted the same way in a copy of vLLM's release tree and run
as `kvcanary soak --engine vllm --vllm-tree COPY` runs it (`run_vllm_soak`), then under vLLM's
own asserts alone: the same histories (seeds, models, lengths) with no audit, until vLLM
raises. Under vLLM's async scheduling (`soak --engine vllm --overlap`: the `hybrid-overlap`
and `hybrid-mamba-overlap` sets) a window freed on the tokens computed, not those processed
(vLLM's bug before its fix), or one token past them, and the Mamba mutants again. Under
speculative decoding (`--speculative-tokens 3`: the `hybrid-spec3` and `hybrid-mamba-spec3`
sets) a window freed on the tokens the step will compute, its unverified drafts included, and
the Mamba mutants again; under both (`hybrid-spec3-overlap`, `hybrid-mamba-spec3-overlap`: a
drafting server's default) the window and Mamba mutants again.

It prints, per variant and seed, the step each side killed it at, the kill rates per engine
and layout, and wall and CPU seconds, to stdout and `bench/out/mutants.json`. Nothing here is
asserted in tests (the test suite only checks that every snippet is found). Usage:

    python bench/mutants.py [--steps 2000] [--seed 0 [1 ...]] [--jobs 2] [--only NAME ...]
        [--wheel W] [--engine sglang|vllm|all]
        [--layout swa|unified|mamba|mamba-extra|swa+radix|swa-tp2|swa+hicache-tp2
                  |swa+hicache-storage-tp2|swa-overlap|swa-tp2-overlap
                  |swa+radix-overlap ...]
        [--vllm-wheel W]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Mutant:
    """One edit of an engine's code: `old` (found exactly once in `path`, relative to the
    tree's `BASE[engine]` folder) becomes `new`. Where another release spells the same code
    differently, `alternatives` holds its (old, new) pairs: the one pair whose old text the
    file has is used, picked by the text, never by a version. A control is an equivalent edit:
    no check may fire."""

    name: str
    path: str
    old: str
    new: str
    what: str
    control: bool = False
    engine: str = "sglang"
    #: the memory layout soak drives it under (`soak --layout`); for vLLM the model
    #: (`soak --engine vllm --vllm-model`), "swa" meaning the default models
    layout: str = "swa"
    #: the same edit as other releases spell the code: (old, new) pairs (vLLM only)
    alternatives: tuple[tuple[str, str], ...] = ()
    #: tensor-parallel ranks soak runs it under (`soak --tp`): a bug that makes ranks part
    tp: int = 1

    @property
    def spellings(self) -> tuple[tuple[str, str], ...]:
        """Every (old, new) pair: the snippets' release's first, then the alternatives."""
        return ((self.old, self.new), *self.alternatives)

    @property
    def relpath(self) -> str:
        """The edited file, relative to the tree (the folder holding the engine's package)."""
        return f"{BASE[self.engine]}/{self.path}"


#: Where each engine's mutated files live, in its tree.
BASE = {"sglang": "sglang/srt", "vllm": "vllm/v1/core"}
#: The release each engine's snippets are written for (a vLLM mutant's `old`; its alternatives
#: are other releases' spellings). On another vLLM release (`--vllm-wheel`) a mutant none of
#: whose snippets is there exactly once is left out, and said so; on this one it fails loudly.
SNIPPETS_FOR = {"sglang": "0.5.23", "vllm": "0.33.0"}


class SnippetError(Exception):
    """A mutant's snippet is not found exactly once: the release changed, fix the mutant."""


#: SGLang 0.5.23's hybrid controller's MIN of a storage hit query over the TP ranks (the
#: storage-on-ranks mutant and its control edit around it)
_HIT_QUERY_MIN = (
    "        self._all_reduce(\n"
    "            packed,\n"
    "            torch.distributed.ReduceOp.MIN,\n"
    "            self.prefetch_hits_sync_groups,\n"
    "        )\n"
)

#: A bench layout's suffix for soak's radix sessions (`--session-radix-cache`): "swa+radix";
#: for its host tier (`--hicache`): "swa+hicache", with the storage tier behind it
#: (`--hicache-storage`): "swa+hicache-storage"; for tensor-parallel ranks (`--tp N`):
#: "swa-tp2" (host tier and ranks: "swa+hicache-tp2"); for SGLang's overlapped loop
#: (`--overlap`): "swa-overlap" (on ranks: "swa-tp2-overlap"; with radix sessions:
#: "swa+radix-overlap").
RADIX, HICACHE, STORAGE, RANKS, OVERLAP = "+radix", "+hicache", "-storage", "-tp", "-overlap"
#: vLLM's speculative decoding (`soak --engine vllm --speculative-tokens K`): "hybrid-spec3".
SPECULATIVE = "-spec"

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "token-free-drops-last",
        "mem_cache/allocator/token.py",
        "            else:\n"
        "                self.free_pages = torch.cat((self.free_pages, free_index))\n",
        "            else:\n"
        "                self.free_pages = torch.cat((self.free_pages, free_index[:-1]))\n",
        "leak: the page-size-1 allocator's free drops the last slot it is given",
    ),
    Mutant(
        "finish-tail-one-short",
        "mem_cache/common.py",
        "tree_cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, owned_kv_len)])",
        "tree_cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, owned_kv_len - 1)])",
        "leak at a page boundary: a released request's tail free stops one token short "
        "(at page size > 1 only a last token alone on its page leaks)",
    ),
    Mutant(
        "overalloc-floor-align",
        "mem_cache/common.py",
        "        start_p = ceil_align(start_p, page_size)\n",
        "        start_p = start_p // page_size * page_size\n",
        "double free at a page boundary: the over-allocated tail free starts at the page "
        "floor, so the page the tail free released is freed again",
    ),
    Mutant(
        "dead-swa-freed-again",
        "mem_cache/common.py",
        "    if swa_dead:\n        allocator.free_full_segments(swa_dead)\n",
        "    if swa_dead:\n        allocator.free_segments(swa_dead)\n",
        "double free of SWA: a released row's out-of-window part (its SWA already freed) "
        "is freed on both sides, through a mapping already cleared",
    ),
    Mutant(
        "swa-window-page-late",
        "mem_cache/common.py",
        "            max(sliding_window_size, page_size), page_size\n        )\n",
        "            max(sliding_window_size, page_size), page_size\n        ) + page_size\n",
        "window threshold one page too far: the decode window free releases SWA a page "
        "inside the window",
    ),
    Mutant(
        "swa-mapping-not-cleared",
        "mem_cache/allocator/swa.py",
        "            assert torch.equal(\n"
        "                    torch.sort(swa_pages.cpu())[0],\n"
        "                    torch.unique(ref[ref > 0] // ps),\n"
        '                ), "swa pages do not match the mapped pages"\n'
        "\n"
        "        self.clear_full_to_swa_mapping(mapping_indices)\n",
        "            assert torch.equal(\n"
        "                    torch.sort(swa_pages.cpu())[0],\n"
        "                    torch.unique(ref[ref > 0] // ps),\n"
        '                ), "swa pages do not match the mapped pages"\n'
        "\n",
        "stale SWA mapping: freeing SWA pages leaves the full-to-SWA mapping pointing at them",
    ),
    Mutant(
        "decode-swa-unmapped",
        "mem_cache/allocator/swa.py",
        "        else:\n"
        "            self.full_to_swa_index_mapping[alloc_full_indices] = alloc_swa_indices\n",
        "        else:\n            pass\n",
        "stale SWA mapping: a paged decode allocates SWA slots but never maps the new full "
        "slots to them",
    ),
    Mutant(
        "paged-decode-page-off-by-one",
        "mem_cache/allocator/paged.py",
        "    need_new_page = ((seq_lens - 1) % page_size == 0).to(torch.int64)\n",
        "    need_new_page = (seq_lens % page_size == 0).to(torch.int64)\n",
        "wrong range at a page boundary: a paged decode opens its new page one token late, "
        "writing the page's first token past the end of the last one",
    ),
    Mutant(
        "swa-lock-half-window",
        "mem_cache/unified_cache/components/swa.py",
        "        sliding_window_size = self.sliding_window_size\n"
        "        covered = 0\n"
        "        swa_uuid = None\n",
        "        sliding_window_size = self.sliding_window_size // 2\n"
        "        covered = 0\n"
        "        swa_uuid = None\n",
        "lock not covering the window: a request's SWA lock covers half its window (the "
        "Python tree core)",
    ),
    Mutant(
        "locked-leaf-evictable",
        "mem_cache/unified_cache/unified_tree_core.py",
        "        if node is self.root_node or node.evicted:\n"
        "            return False\n"
        "        if any(cd.lock_ref > 0 for cd in node.component_data):\n",
        "        if node is self.root_node or node.evicted:\n"
        "            return False\n"
        "        if any(cd.lock_ref > 1 for cd in node.component_data):\n",
        "locked node evicted: a leaf one request locks counts as evictable (the Python tree core)",
    ),
    Mutant(
        "evict-swa-by-swa-value",
        "mem_cache/unified_cache/components/swa.py",
        "            device_frees[self.component_type].append(\n"
        "                node.component_data[BASE_COMPONENT_TYPE].value\n"
        "            )\n"
        "            freed = self.reclaimable_value_len(node)\n",
        "            device_frees[self.component_type].append(cd.value)\n"
        "            freed = self.reclaimable_value_len(node)\n",
        "wrong range: tombstoning a node frees its SWA through its SWA indices read as full "
        "ones (the Python tree core)",
    ),
    Mutant(
        "insert-dup-first-slot-kept",
        "mem_cache/unified_cache/unified_tree_core.py",
        "        dup_start = max(0, state.params.prev_prefix_len - state.total_prefix_length)\n",
        "        dup_start = max(0, state.params.prev_prefix_len - state.total_prefix_length)"
        " + 1\n",
        "leak: an insert that finds its KV already in the tree frees the duplicate but its "
        "first slot (the Python tree core; page size 1)",
    ),
    Mutant(
        "req-row-not-freed",
        "mem_cache/memory_pool.py",
        "        self.free_rows([req.kv.req_pool_idx])\n        req.kv.req_pool_idx = None\n",
        "        req.kv.req_pool_idx = None\n",
        "req_to_token row leaked: releasing a request never gives its pool row back",
    ),
    Mutant(
        "retract-lock-leak",
        "mem_cache/common.py",
        "    tree_cache.unlock(req.lock)\n    req.lock = None\n",
        "    if checkpoint:\n        tree_cache.unlock(req.lock)\n    req.lock = None\n",
        "lock never released on retraction: a request released without a checkpoint keeps "
        "its prefix locked",
    ),
    Mutant(
        "sorted-merge-keeps-staged",
        "mem_cache/allocator/paged.py",
        "        self.free_pages, _ = torch.sort(self.get_all_free_pages())\n"
        "        self.staged_pages = []\n",
        "        self.free_pages, _ = torch.sort(self.get_all_free_pages())\n",
        "double listing: a sorted merge (need_sort) puts the staged pages on the free list "
        "but leaves them staged too",
    ),
    Mutant(
        "token-sorted-merge-keeps-staged",
        "mem_cache/allocator/base.py",
        "            self.free_pages, _ = torch.sort(self.free_pages)\n"
        "            self.release_pages = torch.empty(\n"
        "                (0,), dtype=self.release_pages.dtype, device=self.device\n"
        "            )\n",
        "            self.free_pages, _ = torch.sort(self.free_pages)\n",
        "double listing at page size 1: a sorted merge (need_sort) leaves the merged slots "
        "staged too",
    ),
    Mutant(
        "expand-pages-by-subtraction",
        "mem_cache/allocator/swa.py",
        "        base = (indices // self.page_size) * self.page_size\n",
        "        base = indices - indices % self.page_size\n",
        "control: a page's first slot computed another way (slots are never negative)",
        control=True,
    ),
    Mutant(
        "req-rows-from-the-head",
        "mem_cache/memory_pool.py",
        "        select_index = self.free_slots[-need_size:]\n"
        "        del self.free_slots[-need_size:]\n",
        "        select_index = self.free_slots[:need_size]\n"
        "        del self.free_slots[:need_size]\n",
        "control: pool rows handed out from the head of the free list, not the tail",
        control=True,
    ),
    Mutant(
        "swa-unlock-refreshes-always",
        "mem_cache/unified_cache/components/swa.py",
        "                comp.lock_ref = ref - 1\n            if ref == 1:\n",
        "                comp.lock_ref = ref - 1\n            if ref >= 1:\n",
        "control: an SWA unlock refreshes the node's evictable-leaf membership on every "
        "release, not only the last (the refresh is idempotent)",
        control=True,
    ),
    # -- SGLang 0.5.23's unified memory (soak --layout unified): the two MultiEndedAllocators
    # of UnifiedSWATokenToKVPoolAllocator (full: grows down, owns the virtual ids; swa: grows
    # up, binds the full side's virtual pages), eager compaction ----------------------------
    Mutant(
        "unified-free-keeps-binding",
        "mem_cache/allocator/unified_sub_pool.py",
        "            self.virtual_to_physical.index_fill_(0, free_v_pages, -1)\n",
        "",
        "virtual→physical entry not cleared: a sub-allocator's free recycles a virtual page "
        "(and compacts its physical page away) but leaves the page bound",
        layout="unified",
    ),
    Mutant(
        "unified-free-leaves-swa-bound",
        "mem_cache/allocator/unified_hybrid_swa.py",
        "            live_tokens = v[live_token_mask]\n"
        "            if live_tokens.numel() > 0:\n"
        "                self.swa_attn_allocator.free(live_tokens)\n"
        "            self.full_attn_allocator.free(v)\n",
        "            self.full_attn_allocator.free(v)\n",
        "virtual page freed without unbinding its SWA physical page: the composite's free "
        "releases the full side only, so the id goes back to the free list still bound on "
        "the SWA side",
        layout="unified",
    ),
    Mutant(
        "unified-vacated-band-one-short",
        "mem_cache/allocator/unified_sub_pool.py",
        "            vacated_lo, vacated_hi = old_wm + 1, new_wm + 1\n",
        "            vacated_lo, vacated_hi = old_wm + 1, new_wm\n",
        "off-by-one in a page range: compaction of the grow-down (full) side wipes the "
        "physical→virtual entries of the band it vacated but its top page",
        layout="unified",
    ),
    Mutant(
        "unified-tombstoned-swa-freed-again",
        "mem_cache/allocator/unified_hybrid_swa.py",
        "        if self.free_page_reps_group is None:\n"
        "            self._release_page_reps((), (reps,))\n"
        "        else:\n"
        "            self.full_page_reps_group.append(reps)\n",
        "        if self.free_page_reps_group is None:\n"
        "            self._release_page_reps((reps,), ())\n"
        "        else:\n"
        "            self.free_page_reps_group.append(reps)\n",
        "physical page freed twice: a row segment whose SWA pages are already tombstoned is "
        "released on both sides (free_full_segment queues it as a free_segment)",
        layout="unified",
    ),
    Mutant(
        "unified-decode-page-swa-unbound",
        "mem_cache/allocator/unified_hybrid_swa.py",
        "            if new_virtual_pages.numel() > 0:\n"
        "                self.swa_attn_allocator.alloc_with_virtual(new_virtual_pages)\n"
        "\n"
        "            return out_indices  # virtual TOKEN ids\n",
        "            return out_indices  # virtual TOKEN ids\n",
        "virtual page left unbound: a decode that opens a new page binds it on the full side "
        "only, so its window tokens have no SWA page",
        layout="unified",
    ),
    Mutant(
        "unified-segment-free-leaves-swa-bound",
        "mem_cache/allocator/unified_hybrid_swa.py",
        "        if both:\n"
        "            self._free_swa_page_reps(\n"
        "                both[0] if len(both) == 1 else torch.cat(tuple(both))\n"
        "            )\n"
        "        pieces = (*both, *full_only)\n",
        "        pieces = (*both, *full_only)\n",
        "virtual page freed without unbinding its SWA physical page: a row segment's free "
        "releases the full side only, so the id goes back to the free list still bound on "
        "the SWA side (the path row releases take)",
        layout="unified",
    ),
    Mutant(
        "unified-free-full-side-first",
        "mem_cache/allocator/unified_hybrid_swa.py",
        "            live_tokens = v[live_token_mask]\n"
        "            if live_tokens.numel() > 0:\n"
        "                self.swa_attn_allocator.free(live_tokens)\n"
        "            self.full_attn_allocator.free(v)\n",
        "            live_tokens = v[live_token_mask]\n"
        "            self.full_attn_allocator.free(v)\n"
        "            if live_tokens.numel() > 0:\n"
        "                self.swa_attn_allocator.free(live_tokens)\n",
        "control: the composite's free releases the full side before the SWA side (each side "
        "reads only its own table, the live mask is taken first)",
        control=True,
        layout="unified",
    ),
    # -- SGLang 0.5.23's hybrid Mamba layout (soak --layout mamba): HybridReqToTokenPool, its
    # MambaSlotAllocator, the tree's MambaComponent, the scheduler's early release --------
    Mutant(
        "mamba-slot-zero-handed-out",
        "mem_cache/allocator/mamba.py",
        "        self.free_slots = torch.arange(\n"
        "            1, self.size + 1, dtype=torch.int64, device=self.device\n"
        "        )\n",
        "        self.free_slots = torch.arange(\n"
        "            0, self.size, dtype=torch.int64, device=self.device\n"
        "        )\n",
        "slot 0 handed out: the Mamba free list starts at the reserved padding slot (and "
        "loses the last slot)",
        layout="mamba",
    ),
    Mutant(
        "mamba-evict-keeps-value",
        "mem_cache/unified_cache/components/mamba.py",
        "            self.tree_core.component_evictable_size_[self.component_type] -= freed\n"
        "            cd.value = None\n",
        "            self.tree_core.component_evictable_size_[self.component_type] -= freed\n",
        "tree-held slot freed on evict and kept: evicting a node's Mamba state frees its slot "
        "but the node keeps it (freed again by the next eviction of that node)",
        layout="mamba",
    ),
    Mutant(
        "mamba-row-map-not-written",
        "mem_cache/memory_pool.py",
        "        self.req_index_to_mamba_index_mapping[rows] = mamba_index_tensor\n",
        "",
        "row→slot map not updated: a request's pool row keeps the Mamba slot of the row's "
        "previous request",
        layout="mamba",
    ),
    Mutant(
        "mamba-chunk-donates-live-slot",
        "mem_cache/unified_cache/components/mamba.py",
        "            else:\n                mamba_value_donated = self._alloc_mamba_slot(req)\n",
        "            else:\n"
        "                mamba_value_donated = req.kv.mamba_pool_idx.unsqueeze(0)\n",
        "one slot, two owners: a chunked request's checkpoint gives the tree the request's "
        "own working slot instead of a copy",
        layout="mamba",
    ),
    Mutant(
        "mamba-early-release-keeps-slot",
        "mem_cache/common.py",
        "        if req.kv.holds_mamba:\n"
        "            tree_cache.req_to_token_pool.mamba_allocator.free(\n"
        "                req.kv.mamba_pool_idx.unsqueeze(-1)\n"
        "            )\n"
        "            req.kv.mamba_pool_idx = None\n",
        "        if req.kv.holds_mamba:\n            req.kv.mamba_pool_idx = None\n",
        "Mamba slot not freed: a request released before its KV was allocated (aborted while "
        "waiting, holding its copy-on-write slot) drops the slot without freeing it",
        layout="mamba",
    ),
    Mutant(
        "mamba-unused-chunk-slot-kept",
        "mem_cache/unified_cache/components/mamba.py",
        "            if insert_params.mamba_value is not None and (\n"
        "                insert_result is None or insert_result.mamba_exist\n"
        "            ):\n",
        "            if insert_params.mamba_value is not None and insert_result is None:\n",
        "Mamba slot leaked: a chunk's checkpoint copy the tree did not take (the node already "
        "had a state) is never freed",
        layout="mamba",
    ),
    Mutant(
        "mamba-evicted-slot-not-freed",
        "mem_cache/unified_cache/components/mamba.py",
        "        else:\n"
        "            self.cache.req_to_token_pool.mamba_allocator.free(mamba_value)\n",
        "        else:\n            pass\n",
        "Mamba slot leaked on eviction: a tree node's state is evicted (the node lets go of "
        "it) but its slot never goes back to the free list",
        layout="mamba",
    ),
    Mutant(
        "mamba-free-to-head",
        "mem_cache/allocator/mamba.py",
        "        self.free_slots = torch.cat((self.free_slots, free_index))\n",
        "        self.free_slots = torch.cat((free_index, self.free_slots))\n",
        "control: freed Mamba slots go to the head of the free list (reused first), not the tail",
        control=True,
        layout="mamba",
    ),
    # -- the same layout with SGLang's extra buffer (soak --layout mamba-extra): each running
    # request's ping-pong track slots in HybridReqToTokenPool --------------------------------
    Mutant(
        "mamba-track-slots-not-freed",
        "mem_cache/memory_pool.py",
        "            if len(positions) == size:\n"
        "                self.mamba_allocator.free(row)\n"
        "            else:\n"
        "                for p in positions:\n"
        "                    self.mamba_allocator.free(row[p : p + 1])\n",
        "            pass\n",
        "Mamba slots leaked: a finished (or retracted, or aborted) request's ping-pong track "
        "slots are never freed; the request lets go of its track buffer",
        layout="mamba-extra",
    ),
    Mutant(
        "mamba-track-kept-slot-freed",
        "mem_cache/memory_pool.py",
        "            positions = [p for p in range(size) if p != keep and not empty[p]]\n",
        "            positions = [p for p in range(size) if not empty[p]]\n",
        "a track slot freed while the tree holds it: a finish frees every ping-pong slot, the "
        "one whose state it just handed to the tree too",
        layout="mamba-extra",
    ),
    Mutant(
        "mamba-donated-slot-not-replaced",
        "mem_cache/memory_pool.py",
        "        self.set_mamba_ping_pong_slot(req, donate_idx, new_slot[0])\n",
        "",
        "one slot, two owners: a chunk's checkpoint hands the tree the request's track slot "
        "but the request keeps tracking in it (the fresh slot taken for it is dropped)",
        layout="mamba-extra",
    ),
    Mutant(
        "mamba-track-map-not-synced",
        "mem_cache/memory_pool.py",
        "        self.req_index_to_mamba_ping_pong_track_buffer_mapping[req.kv.req_pool_idx] = (\n"
        "            req.kv.mamba_ping_pong_track_buffer\n"
        "        )\n",
        "",
        "stale ping-pong map: a donation replaces the track slot in the request but not in "
        "the row's map, so the forward keeps writing into the slot the tree now holds (and "
        "the finish frees it from the map)",
        layout="mamba-extra",
    ),
    Mutant(
        "mamba-track-free-one-by-one",
        "mem_cache/memory_pool.py",
        "            if len(positions) == size:\n                self.mamba_allocator.free(row)\n",
        "            if False:\n                self.mamba_allocator.free(row)\n",
        "control: the track slots are always freed one at a time, never the whole row at once",
        control=True,
        layout="mamba-extra",
    ),
    # -- tensor-parallel ranks (soak --tp 2): each rank's tree in its own process ------------
    Mutant(
        "lru-stamp-coarse-tie",
        "mem_cache/unified_cache/components/base.py",
        "    _LAST_ACCESS_TIME_COUNTER_FLOAT += 1.0\n    return ret\n",
        "    _LAST_ACCESS_TIME_COUNTER_FLOAT += 1.0\n    return ret // 64 * 64\n",
        "ranks part on an eviction tie: the tree's access stamps tick once every 64 (a coarse "
        "clock), so leaves stamped within one tick tie and the full side's eviction takes "
        "whichever its set of evictable leaves yields first, an order of each rank's own "
        "object addresses (the Python tree core; the Rust core keeps its own LRU lists)",
        tp=2,
    ),
    Mutant(
        "lru-stamp-floored-by-one",
        "mem_cache/unified_cache/components/base.py",
        "    _LAST_ACCESS_TIME_COUNTER_FLOAT += 1.0\n    return ret\n",
        "    _LAST_ACCESS_TIME_COUNTER_FLOAT += 1.0\n    return ret // 1 * 1\n",
        "control: the access stamp floored to a whole tick of one stamp (the stamps are whole "
        "already)",
        control=True,
        tp=2,
    ),
    # -- the host tier on tensor-parallel ranks (soak --tp 2 --hicache): the acks' all-reduce -
    Mutant(
        "write-ack-not-reduced",
        "mem_cache/unified_radix_cache.py",
        "        return (\n            count_values[0],\n            count_values[1],\n",
        "        return (\n            write_acks,\n            count_values[1],\n",
        "ranks part through the host tier: each rank takes the write-through acks its own "
        "copies finished, not the group's MIN, so a rank whose copy finished first releases "
        "the backup's lock and publishes its host copy steps before the others do",
        layout="swa+hicache",
        tp=2,
    ),
    Mutant(
        "write-ack-reduced-twice",
        "mem_cache/unified_radix_cache.py",
        "        return (\n            count_values[0],\n            count_values[1],\n",
        "        return (\n"
        "            min(count_values[0], write_acks),\n"
        "            count_values[1],\n",
        "control: the group's MIN of write-through acks taken again with the rank's own count "
        "(never below the MIN)",
        control=True,
        layout="swa+hicache",
        tp=2,
    ),
    # -- the storage tier on tensor-parallel ranks (soak --tp 2 --hicache --hicache-storage):
    # the hit query's all-reduce ---------------------------------------------------------------
    Mutant(
        "storage-hits-not-reduced",
        "mem_cache/hybrid_cache/hybrid_cache_controller.py",
        _HIT_QUERY_MIN + "        reduced = packed.tolist()\n",
        "        local_packed = packed.tolist()\n"
        + _HIT_QUERY_MIN
        + "        reduced = local_packed\n",
        "ranks part through the storage tier: each rank's controller meets the others in the "
        "hit query's all-reduce but takes its own storage hit pages, not the group's MIN, so a "
        "rank whose store holds more of a prefix loads more of it than the others",
        layout="swa+hicache-storage",
        tp=2,
    ),
    Mutant(
        "storage-hits-reduced-twice",
        "mem_cache/hybrid_cache/hybrid_cache_controller.py",
        _HIT_QUERY_MIN + "        reduced = packed.tolist()\n",
        "        local_packed = packed.tolist()\n"
        + _HIT_QUERY_MIN
        + "        reduced = [min(a, b) for a, b in zip(packed.tolist(), local_packed)]\n",
        "control: the group's MIN of the hit query taken again with the rank's own values "
        "(never below the MIN)",
        control=True,
        layout="swa+hicache-storage",
        tp=2,
    ),
    # -- SGLang's overlapped loop (soak --overlap): what only matters while a batch is in
    # flight ---------------------------------------------------------------------------------
    Mutant(
        "swa-evicted-under-inflight-prefill",
        "managers/schedule_batch.py",
        "                        req.decode_batch_idx >= 1\n"
        "                        and req.kv.holds_kv\n",
        "                        req.decode_batch_idx >= 0\n"
        "                        and req.kv.holds_kv\n",
        "window: a decode's SWA eviction no longer waits for a request's first decode, so under "
        "the overlapped loop the decode launched right after a prefill frees the SWA slots that "
        "prefill, still in flight, writes and reads (its out-of-window prompt cells); without "
        "overlap the prefill's result is in by then and the early eviction is harmless",
        layout="swa-overlap",
    ),
    Mutant(
        "swa-eviction-gate-spelled-positive",
        "managers/schedule_batch.py",
        "                        req.decode_batch_idx >= 1\n"
        "                        and req.kv.holds_kv\n",
        "                        req.decode_batch_idx > 0\n"
        "                        and req.kv.holds_kv\n",
        "control: the decode's SWA eviction gate written as a positive batch index (the index "
        "is a whole number)",
        control=True,
        layout="swa-overlap",
    ),
    Mutant(
        "finishing-inflight-one-early",
        "managers/schedule_batch.py",
        "        return len(self.output_ids) + 1 >= self.sampling_params.max_new_tokens\n",
        "        return len(self.output_ids) + 2 >= self.sampling_params.max_new_tokens\n",
        "request orphaned: a request two tokens short of its length reads as finished by the "
        "queued result (`_reqs_finishing_inflight`), so the decode leaves it out of the running "
        "batch; that result does not finish it, and it keeps its row, KV and prefix lock in no "
        "batch (only the overlapped loop asks)",
        layout="swa-overlap",
    ),
    Mutant(
        "finishing-inflight-by-remaining",
        "managers/schedule_batch.py",
        "        return len(self.output_ids) + 1 >= self.sampling_params.max_new_tokens\n",
        "        return self.sampling_params.max_new_tokens - len(self.output_ids) <= 1\n",
        "control: whether the next output finishes a request by length, counted from the "
        "tokens it has left",
        control=True,
        layout="swa-overlap",
    ),
    # -- streaming sessions (`--enable-streaming-session`: soak's swa and unified histories) --
    Mutant(
        "session-close-keeps-row",
        "session/streaming_session.py",
        "            self.cache.free_kv_row(slot.kv, [(protected_len, slot.kv.kv_allocated_len)])\n"
        "            self.cache.req_to_token_pool.free(slot)\n",
        "            self.cache.free_kv_row(slot.kv, [(protected_len, slot.kv.kv_allocated_len)])"
        "\n",
        "request row leaked: closing a streaming session frees its KV but never gives its "
        "request pool row back",
    ),
    Mutant(
        "session-close-keeps-kv",
        "session/streaming_session.py",
        "            self.cache.free_kv_row(slot.kv, [(protected_len, slot.kv.kv_allocated_len)])\n"
        "            self.cache.req_to_token_pool.free(slot)\n",
        "            self.cache.req_to_token_pool.free(slot)\n",
        "leak: closing a streaming session gives its row back but never frees the KV it kept "
        "past the tree's part",
    ),
    Mutant(
        "session-close-keeps-lock",
        "session/streaming_session.py",
        "        self.cache.unlock(slot.lock)\n",
        "        pass\n",
        "lock leak: closing a streaming session never releases the tree lock on its prefix",
    ),
    Mutant(
        "turn-abort-keeps-slot",
        "session/streaming_session.py",
        "            del self.slots[req.session.session_id]\n",
        "",
        "use after free: an aborted streaming turn hands its record back and is released, "
        "but the session keeps the record (the freed row and KV) for its next turn",
    ),
    Mutant(
        "turn-match-frees-session-kv",
        "session/streaming_session.py",
        "        self._free_kv_aligned(kv, prefix_len, kv.kv_allocated_len)\n",
        "        self._free_kv_aligned(kv, kv.cache_protected_len, kv.kv_allocated_len)\n",
        "use after free: a streaming turn's match frees the session's own KV from the tree's "
        "part on, not from its prefix, then reads the freed cells as its prefix",
    ),
    Mutant(
        "session-close-frees-rows",
        "session/streaming_session.py",
        "            self.cache.free_kv_row(slot.kv, [(protected_len, slot.kv.kv_allocated_len)])\n"
        "            self.cache.req_to_token_pool.free(slot)\n",
        "            self.cache.free_kv_row(slot.kv, [(protected_len, slot.kv.kv_allocated_len)])\n"
        "            self.cache.req_to_token_pool.free_rows([slot.kv.req_pool_idx])\n"
        "            slot.kv.req_pool_idx = None\n",
        "control: closing a streaming session gives its row back by the pool's row free "
        "itself (what `free` does for it)",
        control=True,
    ),
    # -- radix sessions (`--enable-session-radix-cache`: soak --session-radix-cache, whose
    # sessions are client sessions; the bench's layout `swa+radix`) -----------------------------
    Mutant(
        "radix-close-frees-kv",
        "mem_cache/unified_cache/components/full.py",
        "    def _dec_session_coverage(self, session_id: str, leaf: UnifiedTreeNode) -> None:\n"
        "        node = leaf\n",
        "    def _dec_session_coverage(self, session_id: str, leaf: UnifiedTreeNode) -> None:\n"
        "        cd = leaf.component_data[self.component_type]\n"
        "        if cd.session_ref == 1 and cd.lock_ref == 0 and not leaf.children:\n"
        "            self._full_allocator().free_segment(cd.value, start_pos=0)\n"
        "        node = leaf\n",
        "use after free: closing a radix session frees the KV of a leaf it alone tagged (as "
        "the full-attention tree's session close does) but leaves the node, and its KV, in the "
        "tree",
        layout="swa+radix",
    ),
    Mutant(
        "radix-tag-takes-lock",
        "mem_cache/unified_cache/components/full.py",
        "            node.component_data[self.component_type].session_ref += 1\n",
        "            node.component_data[self.component_type].lock_ref += 1\n",
        "lock leak: a finished turn's session tag locks its path on the full side instead of "
        "marking it (the lock no request holds, never released: the close finds no tag)",
        layout="swa+radix",
    ),
    Mutant(
        "radix-close-keeps-refs",
        "mem_cache/unified_cache/components/base.py",
        "            self._dec_session_coverage(session_id, leaf)\n"
        "            self._unmark_session_leaf(session_id, leaf)\n",
        "            self._unmark_session_leaf(session_id, leaf)\n",
        "priority leak: closing a radix session drops its tags but not the references they "
        "counted, so its nodes are evicted last for good (no memory is held: they stay "
        "evictable)",
        layout="swa+radix",
    ),
    Mutant(
        "radix-close-in-reverse",
        "mem_cache/unified_cache/components/base.py",
        "        leaves = tuple(self._session_leaves.get(session_id, ()))\n",
        "        leaves = tuple(self._session_leaves.get(session_id, ()))[::-1]\n",
        "control: closing a radix session drops its tags in the other order",
        control=True,
        layout="swa+radix",
    ),
    # -- vLLM 0.33.0's block pool (paths under vllm/v1/core/) ---------------------------------
    Mutant(
        "pool-cached-free-not-queued",
        "block_pool.py",
        "        # Blocks to reuse last are appended to the end of the free queue.\n"
        "        self.free_block_queue.append_n(blocks_to_evict_last)\n",
        "        # Blocks to reuse last are appended to the end of the free queue.\n",
        "leak: free_blocks drops a cached block to ref 0 but never queues it (neither free "
        "nor held)",
        engine="vllm",
        alternatives=(
            # 0.24.0 - 0.27.1: the cached blocks' list is called blocks_with_hash
            ("        self.free_block_queue.append_n(blocks_with_hash)\n", ""),
            # 0.14.0 - 0.23.0: one list of the freed blocks, cached or not
            (
                "for block in blocks_list if block.ref_cnt == 0 and not block.is_null",
                "for block in blocks_list if block.ref_cnt == 0 and not block.is_null"
                " and block.block_hash is None",
            ),
            # 0.11.0: the same list, its test on a line of its own
            (
                "            if block.ref_cnt == 0 and not block.is_null\n        ])\n",
                "            if block.ref_cnt == 0 and not block.is_null\n"
                "            and block.block_hash is None\n        ])\n",
            ),
        ),
    ),
    Mutant(
        "pool-free-queues-at-one",
        "block_pool.py",
        "            block.ref_cnt -= 1\n            if block.ref_cnt == 0:\n",
        "            block.ref_cnt -= 1\n            if block.ref_cnt <= 1:\n",
        "freed while held: free_blocks queues a block one other request still holds",
        engine="vllm",
        alternatives=(
            # 0.24.0 - 0.32.0: the null block is skipped in the same test
            (
                "            block.ref_cnt -= 1\n"
                "            if block.ref_cnt == 0 and not block.is_null:\n",
                "            block.ref_cnt -= 1\n"
                "            if block.ref_cnt <= 1 and not block.is_null:\n",
            ),
            # 0.14.0 - 0.23.0: the freed blocks picked by one list comprehension
            (
                "blocks_list if block.ref_cnt == 0 and not block.is_null",
                "blocks_list if block.ref_cnt <= 1 and not block.is_null",
            ),
            # 0.11.0: the same list, its test on a line of its own
            (
                "            if block.ref_cnt == 0 and not block.is_null\n        ])\n",
                "            if block.ref_cnt <= 1 and not block.is_null\n        ])\n",
            ),
        ),
    ),
    Mutant(
        "pool-touch-leaves-queued",
        "block_pool.py",
        "            if block.ref_cnt == 0:\n"
        "                self.free_block_queue.remove(block)\n"
        "            block.ref_cnt += 1\n",
        "            block.ref_cnt += 1\n",
        "freed while held: a prefix hit on an evictable block takes a reference but leaves "
        "the block in the free queue",
        engine="vllm",
        alternatives=(
            # 0.14.0 - 0.32.0: the null block is skipped in the same test
            (
                "            if block.ref_cnt == 0 and not block.is_null:\n"
                "                self.free_block_queue.remove(block)\n"
                "            block.ref_cnt += 1\n",
                "            block.ref_cnt += 1\n",
            ),
            # 0.12.0 - 0.13.0: touch walks each group's blocks in a loop of its own
            (
                "                if block.ref_cnt == 0 and not block.is_null:\n"
                "                    self.free_block_queue.remove(block)\n"
                "                block.ref_cnt += 1\n",
                "                block.ref_cnt += 1\n",
            ),
            # 0.10.0: the same loop, the reference taken through the block's method
            (
                "                if block.ref_cnt == 0 and not block.is_null:\n"
                "                    self.free_block_queue.remove(block)\n"
                "                block.incr_ref()\n",
                "                block.incr_ref()\n",
            ),
        ),
    ),
    Mutant(
        "pool-reuse-keeps-hash",
        "block_pool.py",
        "                self._maybe_evict_cached_block(block)\n"
        "                assert block.ref_cnt == 0\n",
        "                assert block.ref_cnt == 0\n",
        "stale hash: a cached block handed out again keeps its hash and its prefix-map entry",
        engine="vllm",
        alternatives=(
            # 0.34.0: without a metrics collector (the soak's manager) only a block with a
            # hash is evicted
            (
                "                    if block.block_hash is not None:\n"
                "                        self._maybe_evict_cached_block(block)\n",
                "                    if block.block_hash is not None:\n"
                "                        pass\n",
            ),
        ),
    ),
    Mutant(
        "pool-evict-keeps-map-entry",
        "block_pool.py",
        "            if (\n"
        "                self.cached_block_hash_to_block.pop(block_hash, block.block_id)\n"
        "                is not None\n"
        "            ):\n",
        "            if self.cached_block_hash_to_block.contain(block_hash, block.block_id):\n",
        "stale map entry: evicting a block resets its hash but leaves the prefix-cache map "
        "pointing at it",
        engine="vllm",
        alternatives=(
            # 0.14.0 - 0.23.0: a block has one hash, popped in _maybe_evict_cached_block
            (
                "        if self.cached_block_hash_to_block.pop(block_hash, block.block_id)"
                " is None:\n",
                "        if self.cached_block_hash_to_block.get_one_block(block_hash) is None:\n",
            ),
            # 0.11.0: the same pop, its arguments on two lines
            (
                "        if self.cached_block_hash_to_block.pop(block_hash,\n"
                "                                               block.block_id) is None:\n",
                "        if self.cached_block_hash_to_block.get_one_block(block_hash) is None:\n",
            ),
            # 0.10.x: the map is a plain dict of dicts by block id, emptied by hand
            (
                "        block.reset_hash()\n"
                "        blocks_by_id.pop(block.block_id, None)\n"
                "        if len(blocks_by_id) == 0:\n"
                "            del self.cached_block_hash_to_block[block_hash]\n",
                "        block.reset_hash()\n",
            ),
        ),
    ),
    Mutant(
        "pool-evict-keeps-block-hash",
        "block_pool.py",
        "                removed_hashes.append(block_hash)\n        block.reset_hash()\n",
        "                removed_hashes.append(block_hash)\n",
        "stale hash: evicting a block takes it out of the map but leaves its hash on it",
        engine="vllm",
        alternatives=(
            # 0.14.0 - 0.23.0: the hash reset in _maybe_evict_cached_block
            (
                "            # eviction is not needed\n            return False\n\n"
                "        block.reset_hash()\n",
                "            # eviction is not needed\n            return False\n\n",
            ),
            # 0.10.x: the reset right before the block leaves the map's dict
            (
                "        block.reset_hash()\n        blocks_by_id.pop(block.block_id, None)\n",
                "        blocks_by_id.pop(block.block_id, None)\n",
            ),
        ),
    ),
    Mutant(
        "queue-append-overcounts",
        "kv_cache_utils.py",
        "        tail.prev_free_block = last_block\n"
        "\n"
        "        self.num_free_blocks += len(blocks)\n",
        "        tail.prev_free_block = last_block\n"
        "\n"
        "        self.num_free_blocks += len(blocks) + (len(blocks) > 4)\n",
        "free counter ahead of the queue: a cached free of more than four blocks counts one "
        "too many",
        engine="vllm",
        alternatives=(
            # 0.14.0 - 0.31.0: the fake tail not yet held in a local
            (
                "        self.fake_free_list_tail.prev_free_block = last_block\n"
                "\n"
                "        self.num_free_blocks += len(blocks)\n",
                "        self.fake_free_list_tail.prev_free_block = last_block\n"
                "\n"
                "        self.num_free_blocks += len(blocks) + (len(blocks) > 4)\n",
            ),
            # 0.10.x: counted before the blocks are linked in
            (
                "            return\n"
                "        self.num_free_blocks += len(blocks)\n"
                "\n"
                "        last_block = self.fake_free_list_tail.prev_free_block\n",
                "            return\n"
                "        self.num_free_blocks += len(blocks) + (len(blocks) > 4)\n"
                "\n"
                "        last_block = self.fake_free_list_tail.prev_free_block\n",
            ),
        ),
    ),
    Mutant(
        "queue-remove-keeps-prev-link",
        "kv_cache_utils.py",
        "        # Link the next block to the previous block.\n"
        "        next_block.prev_free_block = prev_block\n",
        "        # Link the next block to the previous block.\n",
        "corrupt queue: removing a block from the middle leaves the next block's prev link "
        "pointing at it",
        engine="vllm",
        alternatives=(
            # 0.14.0 - 0.31.0: the neighbours read through the block
            (
                "        # Link the next block to the previous block.\n"
                "        block.next_free_block.prev_free_block = block.prev_free_block\n",
                "        # Link the next block to the previous block.\n",
            ),
        ),
    ),
    Mutant(
        "coordinator-free-first-group",
        "kv_cache_coordinator.py",
        "        for manager in self.single_type_managers:\n            manager.free(request_id)\n",
        "        for manager in self.single_type_managers[:1]:\n"
        "            manager.free(request_id)\n",
        "leak: freeing a request frees its first group only (a hybrid model's window "
        "blocks stay with a finished request)",
        engine="vllm",
    ),
    Mutant(
        "manager-free-keeps-table",
        "single_type_kv_cache_manager.py",
        "        # Default to [] in case a request is freed (aborted) before alloc.\n"
        "        req_blocks = self.req_to_blocks.pop(request_id, [])\n",
        "        # Default to [] in case a request is freed (aborted) before alloc.\n"
        "        req_blocks = list(self.req_to_blocks.get(request_id, []))\n",
        "freed while held: a request's blocks are freed but its block table kept",
        engine="vllm",
    ),
    Mutant(
        "manager-free-drops-first",
        "single_type_kv_cache_manager.py",
        "        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))\n",
        "        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)[1:]))\n",
        "leak: freeing a request skips its first block",
        engine="vllm",
        alternatives=(
            # 0.14.0 - 0.23.0: free() frees the popped table itself
            (
                "        ordered_blocks = reversed(req_blocks)\n",
                "        ordered_blocks = reversed(req_blocks[1:])\n",
            ),
        ),
    ),
    Mutant(
        "window-freed-still-in-table",
        "single_type_kv_cache_manager.py",
        "                break\n"
        "            freed.append(blocks[i])\n"
        "            blocks[i] = self._null_block\n",
        "                break\n            freed.append(blocks[i])\n",
        "freed while held: blocks leaving the sliding window are freed but stay in the "
        "request's table (an in-flight step still reads them)",
        engine="vllm",
        alternatives=(
            # 0.14.0 - 0.22.1 and 0.24.0: the list is called removed_blocks
            (
                "            removed_blocks.append(blocks[i])\n"
                "            blocks[i] = self._null_block\n",
                "            removed_blocks.append(blocks[i])\n",
            ),
            # 0.23.0: cached and uncached blocks are freed apart, the table written after
            # the split
            (
                "                removed_cached_blocks.append(blocks[i])\n"
                "            blocks[i] = self._null_block\n",
                "                removed_cached_blocks.append(blocks[i])\n",
            ),
        ),
    ),
    Mutant(
        "pool-free-queues-below-one",
        "block_pool.py",
        "            block.ref_cnt -= 1\n            if block.ref_cnt == 0:\n",
        "            block.ref_cnt -= 1\n            if block.ref_cnt < 1:\n",
        "control: a block is queued when its count drops below one (it never goes negative)",
        control=True,
        engine="vllm",
        alternatives=(
            # 0.24.0 - 0.32.0: the null block is skipped in the same test
            (
                "            block.ref_cnt -= 1\n"
                "            if block.ref_cnt == 0 and not block.is_null:\n",
                "            block.ref_cnt -= 1\n"
                "            if block.ref_cnt < 1 and not block.is_null:\n",
            ),
            # 0.14.0 - 0.23.0: the freed blocks picked by one list comprehension
            (
                "blocks_list if block.ref_cnt == 0 and not block.is_null",
                "blocks_list if block.ref_cnt < 1 and not block.is_null",
            ),
            # 0.11.0: the same list, its test on a line of its own
            (
                "            if block.ref_cnt == 0 and not block.is_null\n        ])\n",
                "            if block.ref_cnt < 1 and not block.is_null\n        ])\n",
            ),
        ),
    ),
    Mutant(
        "coordinator-free-groups-reversed",
        "kv_cache_coordinator.py",
        "        for manager in self.single_type_managers:\n            manager.free(request_id)\n",
        "        for manager in reversed(self.single_type_managers):\n"
        "            manager.free(request_id)\n",
        "control: a request's groups freed last group first (another queue order, still correct)",
        control=True,
        engine="vllm",
    ),
    Mutant(
        "queue-popleft-one-by-loop",
        "kv_cache_utils.py",
        "        if n == 1:\n            assert curr_block is not None\n",
        "        if n == -1:\n            assert curr_block is not None\n",
        "control: popping one block goes through the general loop",
        control=True,
        engine="vllm",
    ),
    # -- vLLM 0.33.0's hybrid groups' managers (soaked under --vllm-model; 0.34.0 the same) ---
    Mutant(
        "mamba-retires-running-state",
        "single_type_kv_cache_manager.py",
        "        first_block = max(first_block, self._num_retired_blocks.get(request_id, 0))\n"
        "        last_block = min(last_block, len(blocks))\n",
        "        first_block = max(first_block, self._num_retired_blocks.get(request_id, 0))\n"
        "        last_block = min(last_block + 1, len(blocks))\n",
        "state dropped: a Mamba group retires one state block too many, the running state of "
        "the last computed token among them (freed and nulled: the pool stays consistent)",
        engine="vllm",
        layout="hybrid-mamba",
    ),
    Mutant(
        "mamba-retired-kept",
        "single_type_kv_cache_manager.py",
        "            freed.append(blocks[i])\n"
        "            blocks[i] = self._null_block\n"
        "        if freed:\n"
        "            self.block_pool.free_blocks(freed)\n"
        "        self._num_retired_blocks[request_id] = last_block\n",
        "            freed.append(blocks[i])\n"
        "        if freed:\n"
        "            self.block_pool.free_blocks(freed)\n"
        "        self._num_retired_blocks[request_id] = last_block\n",
        "freed while held: a Mamba group retires the states behind the computed tokens but "
        "leaves them in the request's table",
        engine="vllm",
        layout="hybrid-mamba",
    ),
    Mutant(
        "mamba-skipped-states-allocated",
        "single_type_kv_cache_manager.py",
        "                    req_blocks.extend(\n"
        "                        [self._null_block for _ in range(prev_block_len, null_end)]\n"
        "                    )\n",
        "                    req_blocks.extend(\n"
        "                        self.block_pool.get_new_blocks(null_end - prev_block_len)\n"
        "                    )\n",
        "states kept: a Mamba group in prefix-caching mode gives every skipped state of a "
        "prefill chunk a block of its own instead of the null block (held until retired: the "
        "pool stays consistent)",
        engine="vllm",
        layout="hybrid-mamba",
        alternatives=(
            (
                "                    req_blocks.extend(\n"
                "                        [\n"
                "                            self._null_block\n"
                "                            for _ in range(prev_block_len, num_skipped_blocks)\n"
                "                        ]\n"
                "                    )\n",
                "                    req_blocks.extend(\n"
                "                        self.block_pool.get_new_blocks(\n"
                "                            num_skipped_blocks - prev_block_len\n"
                "                        )\n"
                "                    )\n",
            ),
        ),
    ),
    Mutant(
        "mamba-null-test-by-identity",
        "single_type_kv_cache_manager.py",
        "            if blocks[i].is_null:\n                continue\n",
        "            if blocks[i] is self._null_block:\n                continue\n",
        "control: a Mamba retirement skips the null block by identity, not by its flag",
        control=True,
        engine="vllm",
        layout="hybrid-mamba",
    ),
    # -- vLLM's async scheduling (soak --engine vllm --overlap): a step in flight ----------
    Mutant(
        "window-freed-on-computed",
        "kv_cache_manager.py",
        "            max(0, total_computed_tokens - request.num_in_flight_tokens),\n",
        "            total_computed_tokens,\n",
        "window: the blocks a window no longer reads are freed on the tokens computed, not "
        "those processed, so the step in flight loses blocks its window still reads (before "
        "vLLM's fix of #47282 and #47653; 0.26.0 on frees on the tokens processed)",
        engine="vllm",
        layout="hybrid" + OVERLAP,
    ),
    Mutant(
        "window-freed-in-flight-minus-one",
        "kv_cache_manager.py",
        "            max(0, total_computed_tokens - request.num_in_flight_tokens),\n",
        "            max(0, total_computed_tokens - request.num_in_flight_tokens + 1),\n",
        "window: freed one token ahead of the tokens processed (an off-by-one of the fix)",
        engine="vllm",
        layout="hybrid" + OVERLAP,
    ),
    # -- vLLM's speculative decoding (soak --engine vllm --speculative-tokens 3) -----------
    Mutant(
        "window-freed-on-scheduled-drafts",
        "kv_cache_manager.py",
        "            max(0, total_computed_tokens - request.num_in_flight_tokens),\n",
        "            max(0, total_computed_tokens - request.num_in_flight_tokens)\n"
        "            + num_new_tokens,\n",
        "window: freed on the tokens the step will compute, its unverified drafts included, so "
        "a rejected draft's window reads blocks already freed (without drafts every token "
        "scheduled is computed, and the state after each step reads clean)",
        engine="vllm",
        layout="hybrid" + SPECULATIVE + "3",
    ),
    # -- vLLM's reference sliding window (R-SWA, 0.30.0 on: soak --vllm-model hybrid-rswa) --
    Mutant(
        "rswa-gap-from-prompt-floor",
        "single_type_kv_cache_manager.py",
        "        first_gap_block = cdiv(num_prompt_tokens, bs)\n",
        "        first_gap_block = num_prompt_tokens // bs\n",
        "window: a reference sliding window's gap begins at the block the prompt ends in, so "
        "the prompt's partial last block, which every step still reads, is freed",
        engine="vllm",
        layout="hybrid-rswa",
    ),
    Mutant(
        "rswa-gap-through-window-start",
        "single_type_kv_cache_manager.py",
        "        last_gap_block = window_start // bs  # exclusive upper bound\n",
        "        last_gap_block = window_start // bs + 1  # exclusive upper bound\n",
        "window: a reference sliding window's gap runs through the block of the window's first "
        "token, which the window still reads",
        engine="vllm",
        layout="hybrid-rswa",
    ),
    Mutant(
        "rswa-gap-start-by-negation",
        "single_type_kv_cache_manager.py",
        "        first_gap_block = cdiv(num_prompt_tokens, bs)\n",
        "        first_gap_block = -(-num_prompt_tokens // bs)\n",
        "control: the gap's first block computed by negated floor division",
        control=True,
        engine="vllm",
        layout="hybrid-rswa",
    ),
    Mutant(
        "chunked-local-drops-current-chunk",
        "single_type_kv_cache_manager.py",
        "        num_skipped_tokens = (\n"
        "            num_computed_tokens // self.attention_chunk_size\n"
        "        ) * self.attention_chunk_size\n",
        "        num_skipped_tokens = (\n"
        "            num_computed_tokens // self.block_size\n"
        "        ) * self.block_size\n",
        "window: chunked local attention drops every block before the current one, blocks of "
        "the current chunk it still reads among them",
        engine="vllm",
        layout="hybrid-chunked-local",
    ),
    Mutant(
        "chunked-local-hit-skips-chunk-start",
        "single_type_kv_cache_manager.py",
        "        local_attention_start_block_idx = (\n"
        "            local_attention_start_idx // kv_cache_spec.block_size\n"
        "        )\n",
        "        local_attention_start_block_idx = (\n"
        "            local_attention_start_idx // kv_cache_spec.block_size + 1\n"
        "        )\n",
        "window: a chunked-local prefix hit hands the current chunk's first block out as the "
        "null block",
        engine="vllm",
        layout="hybrid-chunked-local",
    ),
    Mutant(
        "chunked-local-skip-by-remainder",
        "single_type_kv_cache_manager.py",
        "        num_skipped_tokens = (\n"
        "            num_computed_tokens // self.attention_chunk_size\n"
        "        ) * self.attention_chunk_size\n",
        "        num_skipped_tokens = (\n"
        "            num_computed_tokens - num_computed_tokens % self.attention_chunk_size\n"
        "        )\n",
        "control: the current chunk's start computed from the remainder",
        control=True,
        engine="vllm",
        layout="hybrid-chunked-local",
    ),
)
#: Mutants soaked again under the engine's overlapped loop (`--overlap`), named
#: `NAME-overlapped`: the coarse access stamps that part ranks, the ranks' acks and storage
#: hits not reduced (the host and storage tiers on ranks), and the radix sessions' code, whose
#: close may meet a turn that a result still queued finishes; vLLM's Mamba group under its
#: async scheduling, where states are retired on the tokens processed, a step behind.
AGAIN_OVERLAPPED = (
    "lru-stamp-coarse-tie",
    "lru-stamp-floored-by-one",
    "write-ack-not-reduced",
    "write-ack-reduced-twice",
    "storage-hits-not-reduced",
    "storage-hits-reduced-twice",
    "radix-close-frees-kv",
    "radix-tag-takes-lock",
    "radix-close-keeps-refs",
    "radix-close-in-reverse",
    "mamba-retires-running-state",
    "mamba-retired-kept",
    "mamba-skipped-states-allocated",
    "mamba-null-test-by-identity",
)
MUTANTS += tuple(
    replace(mutant, name=f"{mutant.name}-overlapped", layout=mutant.layout + OVERLAP)
    for mutant in MUTANTS
    if mutant.name in AGAIN_OVERLAPPED
)
#: vLLM's Mamba mutants soaked again under speculative decoding (`--speculative-tokens 3`),
#: named `NAME-drafting`: a group with a scratch block per draft, whose bound grows by them.
AGAIN_DRAFTING = (
    "mamba-retires-running-state",
    "mamba-retired-kept",
    "mamba-skipped-states-allocated",
    "mamba-null-test-by-identity",
)
MUTANTS += tuple(
    replace(mutant, name=f"{mutant.name}-drafting", layout=mutant.layout + SPECULATIVE + "3")
    for mutant in MUTANTS
    if mutant.name in AGAIN_DRAFTING
)
#: vLLM's window and Mamba mutants soaked again under async scheduling with drafts
#: (`--overlap --speculative-tokens 3`, a drafting server's default), named
#: `NAME-async-drafting`: a step's rejected drafts stay counted computed until its output is
#: processed, a step after the next was scheduled.
AGAIN_ASYNC_DRAFTING = (
    "window-freed-on-computed",
    "window-freed-in-flight-minus-one",
    "window-freed-on-scheduled-drafts",
    *AGAIN_DRAFTING,
)
MUTANTS += tuple(
    replace(
        mutant,
        name=f"{mutant.name}-async-drafting",
        layout=mutant.layout.removesuffix(OVERLAP).partition(SPECULATIVE)[0]
        + f"{SPECULATIVE}3{OVERLAP}",
    )
    for mutant in MUTANTS
    if mutant.name in AGAIN_ASYNC_DRAFTING
)


def mutated(text: str, mutant: Mutant) -> str:
    """`text` with the mutant's edit, by the one (old, new) pair whose old text is there;
    SnippetError unless exactly one pair's is, and that one exactly once."""
    spellings = mutant.spellings
    counts = [text.count(old) for old, _ in spellings]
    present = [i for i, n in enumerate(counts) if n]
    where = f"in {mutant.relpath} (expected once): the release changed, fix the mutant"
    if len(present) > 1:
        raise SnippetError(
            f"mutant {mutant.name}: {len(present)} of its {len(spellings)} snippets are found "
            f"in {mutant.relpath} (expected one): the alternatives overlap, fix the mutant"
        )
    if not present:
        if len(spellings) == 1:
            raise SnippetError(f"mutant {mutant.name}: its snippet is found 0 times {where}")
        raise SnippetError(
            f"mutant {mutant.name}: none of its {len(spellings)} snippets is found {where}"
        )
    [i] = present
    if counts[i] != 1:
        raise SnippetError(f"mutant {mutant.name}: its snippet is found {counts[i]} times {where}")
    old, new = spellings[i]
    return text.replace(old, new)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def plant(release: Path, mutant: Mutant | None, into: Path) -> Path:
    """A copy of the release tree (the folder holding `sglang/` or `vllm/`) at `into`, files
    hard-linked, with `mutant` applied (None: the release as it is). The edited file is a new
    file, so the release is never written through a link."""
    shutil.copytree(release, into, copy_function=_link_or_copy)
    if mutant is not None:
        target = into / mutant.relpath
        text = mutated(target.read_text(), mutant)
        target.unlink()
        target.write_text(text)
    return into


# -- the child: one variant's soak and SGLang's checks alone, per seed ---------------------


def _first_complaint(
    ranks: list[tuple[Any, Any]], limit: int, counters: Any = None, group: Any = None
) -> tuple[int, str, str] | None:
    """Run one history to `limit` steps under SGLang's checks alone, each rank's (scheduler,
    checks) in lockstep (`counters`: the ranks' own `soak.tp.RankGlobals`; `group`: the
    ranks' in-process all-reduce, `soak.tp_group.RankGroup`, with the host tier): the step,
    what was said and where (the step's mode, or `crash`) of their first complaint; None:
    silent."""
    from contextlib import nullcontext

    from kvcanary_cli.soak.tp_group import collectives_in_process

    lead = ranks[0][0]

    def as_rank(i: int) -> Any:
        return nullcontext() if counters is None else counters.as_rank(i)

    def step(scheduler: Any, checks: Any) -> tuple[str, str] | None:
        """One rank's step and its checks: (what was said, where), or None."""
        try:
            info = scheduler.step()
        except Exception as exc:  # SGLang's own assert or error: it saw something
            return f"{type(exc).__name__}: {exc}".splitlines()[0], "crash"
        said = checks.idle() if info.mode == "idle" else checks.busy()
        return (f"{said[0].check}: {said[0].message}", info.mode) if said else None

    with nullcontext() if group is None else collectives_in_process():
        while lead.step_no < limit:
            at = lead.step_no
            if group is not None:
                heard = group.run([partial(step, *rank) for rank in ranks])
            else:
                heard = []
                for i, rank in enumerate(ranks):
                    with as_rank(i):
                        heard.append(step(*rank))
                    if heard[-1] is not None:
                        break
            for said in heard:
                if said is not None:
                    return at, *said
            if lead.done and lead.step_no >= lead.workload.steps:
                for i, (_, checks) in enumerate(ranks):
                    with as_rank(i):
                        idle = checks.idle()
                    if idle:
                        return at, f"{idle[0].check}: {idle[0].message}", "idle"
                return None
    return None


class BenchLayout(NamedTuple):
    """What a bench layout names: soak's layout and the switches it runs with."""

    layout: str
    radix: bool
    hicache: bool
    tp: int
    #: the storage tier behind the host tier (`--hicache-storage`)
    storage: bool = False
    #: SGLang's overlapped loop (`--overlap`)
    overlap: bool = False


def soak_layout(layout: str) -> BenchLayout:
    """The soak layout a bench layout names, whether it runs radix sessions, the host tier
    or the storage tier behind it, its ranks, and whether SGLang's overlapped loop runs."""
    overlap = layout.endswith(OVERLAP)
    layout = layout.removesuffix(OVERLAP)
    layout, _, ranks = layout.partition(RANKS)
    storage = layout.endswith(HICACHE + STORAGE)
    layout = layout.removesuffix(STORAGE) if storage else layout
    base = layout.removesuffix(RADIX).removesuffix(HICACHE)
    return BenchLayout(
        base, layout.endswith(RADIX), layout.endswith(HICACHE), int(ranks or 1), storage, overlap
    )


def sglang_alone(modules: Any, budget: int, seed: int, layout: str = "swa") -> dict[str, Any]:
    """SGLang's checks with no kvcanary audit, on the histories soak runs (the same seeds,
    stack shapes, workloads and serving options as `soak()`'s, and the same budget): where
    they first complained, or SGLang crashed. A layout `L+radix` runs soak's radix sessions
    (`--session-radix-cache`: the Python tree core); `L+hicache`, SGLang's host tier;
    `L-tpN`, N ranks, each rank's checks on its own stack (with the host tier, the ranks'
    acks meeting in soak's in-process group, `soak.tp.host_tier_group`); `L-overlap`,
    SGLang's overlapped loop (the workload's `overlap`: the scheduler runs it, and SGLang's
    idle checks wait for its result queue to empty, `Scheduler.fully_idle`)."""
    from contextlib import nullcontext

    from kvcanary_cli.soak.audit import SGLangChecks
    from kvcanary_cli.soak.command import _specs, history_workload
    from kvcanary_cli.soak.driver import Scheduler, serving_options
    from kvcanary_cli.soak.run import history_stack, ranks_storage_folder
    from kvcanary_cli.soak.stack import drives_streaming_sessions, has_path_cap
    from kvcanary_cli.soak.tp import RankGlobals, host_tier_group

    layout, radix, hicache, tp, storage, overlap = soak_layout(layout)
    specs = _specs(None, ("python",) if radix else modules.cores, None, layout)
    path_cap = has_path_cap(modules)
    streaming = drives_streaming_sessions(modules)
    steps = histories = 0
    while steps < budget:
        spec = specs[histories % len(specs)]
        # the workload soak's command draws for this history, under the same serving options
        workload = history_workload(
            seed,
            histories,
            len(specs),
            spec.page_size,
            layout,
            path_cap=path_cap,
            hicache=hicache,
            streaming=streaming,
            radix=radix,
            storage=storage,
            overlap=overlap,
        )
        counters = RankGlobals(tp) if tp > 1 else None
        shared = ranks_storage_folder(workload, tp)  # soak's: the ranks' storage tiers share it
        ranks = []
        for i in range(tp):
            with nullcontext() if counters is None else counters.as_rank(i):
                # soak's stack: its switches, as drawn
                stack = history_stack(
                    modules, spec, workload, rank=i, ranks=tp, storage_folder=shared
                )
                scheduler = Scheduler(stack, workload)
                ranks.append((scheduler, SGLangChecks(scheduler)))
        scheduler = ranks[0][0]
        group = None if counters is None else host_tier_group([r[0] for r in ranks], counters)
        limit = min(workload.steps * 4 + 64, budget - steps)
        undo = serving_options(workload, modules.schedule_batch)
        try:
            first = _first_complaint(ranks, limit, counters, group)
        finally:
            undo()
        if first is not None:
            at, said, where = first
            return {
                "steps": steps + at + 1,
                "history": histories,
                "page_size": spec.page_size,
                "core": spec.core,
                "step": at,
                "where": where,
                "said": said[:200],
            }
        histories += 1
        steps += scheduler.step_no
    return {"steps": None, "ran": steps}


def _soak_side(report: Any) -> dict[str, Any]:
    """Where the soak command's report says kvcanary (or SGLang's crash) killed the variant."""
    failure = report.failure
    side: dict[str, Any] = {
        "steps": None if failure is None else report.steps,
        "ran": report.steps,
        "sglang_said": [c.check for c in report.sglang_checks],
    }
    if failure is not None:
        side.update(
            history=report.histories - 1,
            page_size=failure.page_size,
            core=failure.core,
            step=failure.step,
            where=failure.when,
            said=(
                f"crash {failure.crash.exception}: {failure.crash.message}"
                if failure.crash is not None
                else f"rank {failure.rank} parted ({failure.divergence.kind}): "
                f"{failure.divergence.message}"
                if failure.divergence is not None
                else f"{', '.join(failure.codes)} (cause: {failure.top_cause})"
                + (
                    ""
                    if failure.crash_after is None
                    else f"; then SGLang crashed: {failure.crash_after.exception}"
                )
            )[:200],
            crash=failure.crash is not None,
            shrunk=list(report.shrunk_arrivals or ()),
        )
    elif report.seen is not None:  # SGLang complained within the soak, kvcanary did not
        side["sglang_only"] = True
    return side


def child(tree: Path, budget: int, seeds: list[int], result: Path, layout: str = "swa") -> None:
    """Run one variant, per seed: the soak command's `soak()` on `layout` (`L+radix`: with
    radix sessions; `L-tpN`: with N tensor-parallel ranks; `L-overlap`: under SGLang's
    overlapped loop), then SGLang's checks alone."""
    from kvcanary_cli.dump.streams import standard_output_on_standard_error
    from kvcanary_cli.soak.command import soak
    from kvcanary_cli.soak.stack import load_sglang

    record: dict[str, Any] = {"runs": []}
    started = time.monotonic()
    with standard_output_on_standard_error():
        modules = load_sglang(tree)
        record["import_s"] = round(time.monotonic() - started, 2)
        for seed in seeds:
            run: dict[str, Any] = {"seed": seed}
            with tempfile.TemporaryDirectory(prefix="kvcanary-mutant-") as out:
                t0 = time.monotonic()
                report = soak(
                    sglang_tree=str(tree),
                    steps=budget,
                    seed=seed,
                    out=Path(out) / "o",
                    layout=soak_layout(layout).layout,
                    session_radix_cache=soak_layout(layout).radix,
                    hicache=soak_layout(layout).hicache,
                    hicache_storage=soak_layout(layout).storage,
                    tp=soak_layout(layout).tp,
                    overlap=soak_layout(layout).overlap,
                )
                run["soak_s"] = round(time.monotonic() - t0, 2)
            run["soak"] = _soak_side(report)
            t0 = time.monotonic()
            run["sglang"] = sglang_alone(modules, budget, seed, layout)
            run["sglang_s"] = round(time.monotonic() - t0, 2)
            record["runs"].append(run)
    result.write_text(json.dumps(record))


def vllm_scheduling(layout: str) -> tuple[str | None, bool, int]:
    """A vLLM bench layout's models (None, for "-": soak's default), whether it runs under
    async scheduling (`L-overlap`), and the draft tokens a decode step verifies (`L-specK`)."""
    overlap = layout.endswith(OVERLAP)
    layout, _, drafts = layout.removesuffix(OVERLAP).partition(SPECULATIVE)
    return (None if layout == "-" else layout), overlap, int(drafts or 0)


def vllm_alone(
    modules: Any,
    budget: int,
    seed: int,
    models: str | None = None,
    overlap: bool = False,
    speculative: int = 0,
) -> dict[str, Any]:
    """vLLM's own asserts with no kvcanary audit, on the histories soak runs (same seeds,
    models, lengths and scheduling): where vLLM first raised."""
    from kvcanary_cli.soak.vllm_command import AFTER_STEPS, HISTORY_STEPS, chosen_models
    from kvcanary_cli.soak.vllm_driver import run_history

    chosen = chosen_models(models)
    ran = histories = 0
    while ran < budget:
        model = chosen[histories % len(chosen)]
        length = min(HISTORY_STEPS, budget - ran)
        h = run_history(
            modules,
            model,
            seed + histories,
            length,
            audit_every=False,
            after_steps=AFTER_STEPS,
            overlap=overlap,
            speculative=speculative,
        )
        crash = h.crash
        if crash is not None:
            return {
                "steps": ran + crash.step + 1,
                "history": histories,
                "model": model,
                "step": crash.step,
                "where": (crash.raised_in or "?").rsplit(" in ", 1)[-1],
                "said": f"{crash.exception} in {crash.raised_in}: {crash.message}"[:200],
            }
        histories += 1
        ran += h.steps
    return {"steps": None, "ran": ran}


def _vllm_soak_side(report: Any) -> dict[str, Any]:
    """Where `run_vllm_soak`'s report says kvcanary (or vLLM's assert) killed the variant."""
    before = sum(h.steps for h in report.histories[:-1])
    last = report.histories[-1]
    side: dict[str, Any] = {"steps": None, "ran": before + last.steps}
    if last.findings:
        top = last.findings[0]
        side.update(
            steps=before + (last.finding_step or 0) + 1,
            history=len(report.histories) - 1,
            model=last.model,
            step=last.finding_step,
            where="audit",
            said=f"{top.code}: {top.message}"[:200],
        )
    elif last.engine_said is not None:  # vLLM raised in a step before kvcanary's audit
        said = last.engine_said
        side.update(
            steps=before + said.step + 1,
            history=len(report.histories) - 1,
            model=last.model,
            step=said.step,
            where="crash",
            said=f"crash {said.exception} in {said.raised_in}: {said.message}"[:200],
        )
    if last.engine_said is not None:
        side["vllm_said_at"] = before + last.engine_said.step + 1
    return side


def vllm_child(
    tree: Path,
    budget: int,
    seeds: list[int],
    result: Path,
    models: str | None = None,
    overlap: bool = False,
    speculative: int = 0,
) -> None:
    """Run one vLLM variant, per seed: `soak --engine vllm`'s `run_vllm_soak` (under
    `--vllm-model models`, None: the default models; `overlap`: under vLLM's async
    scheduling; `speculative`: that many draft tokens a decode step), then vLLM's asserts
    alone."""
    from kvcanary_cli.soak.vllm_command import run_vllm_soak
    from kvcanary_cli.soak.vllm_stack import load_vllm

    record: dict[str, Any] = {"runs": []}
    started = time.monotonic()
    load_vllm(tree)
    record["import_s"] = round(time.monotonic() - started, 2)
    for seed in seeds:
        run: dict[str, Any] = {"seed": seed}
        with tempfile.TemporaryDirectory(prefix="kvcanary-mutant-") as out:
            t0 = time.monotonic()
            report = run_vllm_soak(
                str(tree),
                budget,
                seed,
                None,
                models=models,
                out=Path(out) / "o",
                overlap=overlap,
                speculative=speculative,
            )
            run["soak_s"] = round(time.monotonic() - t0, 2)
        run["soak"] = _vllm_soak_side(report)
        t0 = time.monotonic()
        run["vllm"] = vllm_alone(load_vllm(tree), budget, seed, models, overlap, speculative)
        run["vllm_s"] = round(time.monotonic() - t0, 2)
        record["runs"].append(run)
    result.write_text(json.dumps(record))


# -- the parent: plant, run in parallel, report --------------------------------------------


def _release_tree(wheel: str | None) -> Path:
    from kvcanary_cli.soak.stack import find_tree
    from tests.sglang_wheel import wheel_path

    source = wheel or wheel_path()
    if source is None:
        sys.exit("no SGLang 0.5.23 wheel: give --wheel PATH (a wheel or an unpacked tree)")
    return find_tree(source).root


def _vllm_release_tree(wheel: str | None) -> tuple[Path, str]:
    """The vLLM tree's root and version (default: the cached wheel the snippets are for)."""
    from kvcanary_cli.soak.vllm_stack import find_vllm_tree
    from tests.vllm_wheel import wheel_path

    source = wheel or wheel_path(SNIPPETS_FOR["vllm"])
    if source is None:
        sys.exit(
            f"no vLLM {SNIPPETS_FOR['vllm']} wheel: give --vllm-wheel PATH (a wheel or an "
            "unpacked tree)"
        )
    tree = find_vllm_tree(source)
    return tree.root, tree.version


def _fitting(tree: Path, version: str, chosen: list[Mutant]) -> tuple[list[Mutant], list[str]]:
    """The vLLM mutants whose snippets are found once in `tree`, and what was left out (only
    on a release other than the snippets' own: there a missing snippet fails loudly)."""
    if version == SNIPPETS_FOR["vllm"]:
        return chosen, []
    kept, left_out = [], []
    for m in chosen:
        try:
            mutated((tree / m.relpath).read_text(), m)
        except (SnippetError, OSError) as exc:
            left_out.append(f"{m.name}: {exc}" if isinstance(exc, OSError) else str(exc))
            continue
        kept.append(m)
    print(
        f"note: the vLLM mutants' snippets are written for vLLM {SNIPPETS_FOR['vllm']}; this "
        f"tree is vLLM {version}: {len(kept)} of {len(chosen)} apply"
        + "".join(f"\n  left out: {line}" for line in left_out),
        file=sys.stderr,
    )
    return kept, left_out


def _start(
    name: str, group: tuple[str, str], tree: Path, args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    result = scratch / f"{name}.json"
    engine, layout = group
    command = [
        sys.executable,
        __file__,
        "--child",
        str(tree),
        "--child-engine",
        engine,
        "--child-layout",
        layout,
        "--steps",
        str(args.steps),
        "--seed",
        *(str(seed) for seed in args.seed),
        "--result",
        str(result),
    ]
    log = (scratch / f"{name}.log").open("wb")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    return {"name": name, "process": process, "result": result, "log": log, "t0": time.monotonic()}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: Every (engine, layout) a variant runs under, in report order; a release of each is run.
GROUPS: tuple[tuple[str, str], ...] = (
    ("sglang", "swa"),
    ("sglang", "unified"),
    ("sglang", "mamba"),
    ("sglang", "mamba-extra"),
    ("sglang", "swa" + RADIX),
    ("sglang", "swa-tp2"),
    ("sglang", "swa" + HICACHE + "-tp2"),
    ("sglang", "swa" + HICACHE + STORAGE + "-tp2"),
    ("sglang", "swa" + OVERLAP),
    ("sglang", "swa" + RANKS + "2" + OVERLAP),
    ("sglang", "swa" + RADIX + OVERLAP),
    ("sglang", "swa" + HICACHE + "-tp2" + OVERLAP),
    ("sglang", "swa" + HICACHE + STORAGE + "-tp2" + OVERLAP),
    ("vllm", "-"),
    ("vllm", "hybrid-mamba"),
    ("vllm", "hybrid-mamba" + OVERLAP),
    ("vllm", "hybrid" + OVERLAP),
    ("vllm", "hybrid" + SPECULATIVE + "3"),
    ("vllm", "hybrid-mamba" + SPECULATIVE + "3"),
    ("vllm", "hybrid" + SPECULATIVE + "3" + OVERLAP),
    ("vllm", "hybrid-mamba" + SPECULATIVE + "3" + OVERLAP),
    ("vllm", "hybrid-chunked-local"),
    ("vllm", "hybrid-rswa"),
)


def _group(mutant: Mutant) -> tuple[str, str]:
    if mutant.engine == "vllm":
        return (mutant.engine, "-" if mutant.layout == "swa" else mutant.layout)
    base = mutant.layout.removesuffix(OVERLAP)
    ranks = "" if mutant.tp == 1 else f"{RANKS}{mutant.tp}"
    return (mutant.engine, base + ranks + mutant.layout[len(base) :])


def _release_name(group: tuple[str, str]) -> str:
    engine, layout = group
    if engine == "vllm":
        return "vllm-release" if layout == "-" else f"vllm-{layout}-release"
    return "release" if layout == "swa" else f"{layout}-release"


def _chosen_groups(args: argparse.Namespace) -> list[tuple[str, str]]:
    engines = ("sglang", "vllm") if args.engine == "all" else (args.engine,)
    layouts = args.layout or [layout for engine, layout in GROUPS if engine == "sglang"]
    return [g for g in GROUPS if g[0] in engines and (g[0] != "sglang" or g[1] in layouts)]


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Plant every chosen variant (and the release of each layout), run them `--jobs` at a
    time."""
    groups = _chosen_groups(args)
    versions = {"sglang": SNIPPETS_FOR["sglang"]}
    releases: dict[str, Path] = {}
    for engine in dict.fromkeys(g[0] for g in groups):
        if engine == "sglang":
            releases[engine] = _release_tree(args.wheel)
        else:
            releases[engine], versions[engine] = _vllm_release_tree(args.vllm_wheel)
    chosen = [m for m in MUTANTS if _group(m) in groups and (not args.only or m.name in args.only)]
    left_out: list[str] = []
    if "vllm" in releases:
        vllm = [m for m in chosen if m.engine == "vllm"]
        kept, left_out = _fitting(releases["vllm"], versions["vllm"], vllm)
        chosen = [m for m in chosen if m.engine != "vllm" or m in kept]
    variants: list[tuple[str, Mutant | None]] = []
    group_of: dict[str, tuple[str, str]] = {}
    for group in groups:
        if not args.only:
            variants.append((_release_name(group), None))
            group_of[_release_name(group)] = group
        for m in chosen:
            if _group(m) == group:
                variants.append((m.name, m))
                group_of[m.name] = group
    load = os.getloadavg()[0]  # the machine is shared: what else ran as it started
    started, cpu0 = time.monotonic(), _cpu()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kvcanary-mutants-") as folder:
        scratch = Path(folder)
        trees = {
            name: plant(releases[group_of[name][0]], m, scratch / name) for name, m in variants
        }
        pending = list(variants)
        running: list[dict[str, Any]] = []
        while pending or running:
            while pending and len(running) < args.jobs:
                name, _ = pending.pop(0)
                running.append(_start(name, group_of[name], trees[name], args, scratch))
            time.sleep(0.2)
            for job in [j for j in running if j["process"].poll() is not None]:
                running.remove(job)
                job["log"].close()
                wall = round(time.monotonic() - job["t0"], 1)
                if job["process"].returncode != 0 or not job["result"].is_file():
                    tail = (scratch / f"{job['name']}.log").read_text(errors="replace")[-2000:]
                    rows[job["name"]] = {"error": tail, "wall_s": wall}
                else:
                    rows[job["name"]] = {**json.loads(job["result"].read_text()), "wall_s": wall}
                print(f"  {job['name']}: done in {wall} s", file=sys.stderr, flush=True)
    return {
        "steps": args.steps,
        "seeds": list(args.seed),
        "jobs": args.jobs,
        "cores": os.cpu_count(),
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "wall_s": round(time.monotonic() - started, 1),
        "cpu_s": round(_cpu() - cpu0, 1),
        "versions": versions,
        "left_out": left_out,
        "variants": {
            name: {
                "mutant": m,
                "engine": group_of[name][0],
                "layout": group_of[name][1],
                **rows[name],
            }
            for name, m in variants
        },
    }


def _at(side: dict[str, Any] | None) -> str:
    if not side:
        return "?"
    if side.get("steps") is None:
        return f"-- ({side.get('ran')})"
    if "model" in side:
        return f"{side['steps']} ({side['model']}, {side['where']})"[:38]
    return f"{side['steps']} (ps {side['page_size']} {side['core']}, {side['where']})"


#: Per engine: the release's name, and the name of its own checks.
_ENGINES = {
    "sglang": ("SGLang", "SGLang", "SGLang's checks alone"),
    "vllm": ("vLLM", "vLLM", "vLLM's asserts alone"),
}


def report(figures: dict[str, Any]) -> list[str]:
    """The table and the kill rates, per engine and layout, as lines."""
    lines: list[str] = []
    for engine, layout in GROUPS:
        rows = {
            n: r
            for n, r in figures["variants"].items()
            if (r.get("engine", "sglang"), r.get("layout", "swa" if engine == "sglang" else "-"))
            == (engine, layout)
        }
        if rows:
            lines += _group_report(figures, rows, engine, layout)
    lines.append(f"whole set: {figures['wall_s']} s wall, {figures['cpu_s']} s CPU")
    return lines


def _group_report(
    figures: dict[str, Any], rows: dict[str, Any], engine: str, layout: str
) -> list[str]:
    name, short, alone = _ENGINES[engine]
    version = figures.get("versions", {}).get(engine, SNIPPETS_FOR[engine])
    release = f"{name} {version}"
    if version != SNIPPETS_FOR[engine]:
        release += f" (snippets written for {SNIPPETS_FOR[engine]}"
        release += f"; {len(figures.get('left_out', []))} left out)"
    layout_only, radix, hicache, ranks, storage, overlap = soak_layout(layout)
    flags = (
        (" --session-radix-cache" if radix else "")
        + (" --hicache" if hicache else "")
        + (" --hicache-storage" if storage else "")
        + (f" --tp {ranks}" if ranks > 1 else "")
        + (" --overlap" if overlap else "")
    )
    where = f" (soak --layout {layout_only}{flags})" if engine == "sglang" else ""
    if engine == "vllm" and layout != "-":
        model, overlap, drafts = vllm_scheduling(layout)
        loop = (" --overlap" if overlap else "") + (
            f" --speculative-tokens {drafts}" if drafts else ""
        )
        where = f" (soak --engine vllm --vllm-model {model}{loop})"
    lines = [
        f"mutants of {release}{where}, {figures['steps']} steps per seed, seeds "
        f"{', '.join(map(str, figures['seeds']))}, {figures['jobs']} at a time on "
        f"{figures['cores']} cores (load average {figures['load_before']:.2f} before, "
        f"{figures['load_after']:.2f} after)",
        f"{'variant':34} {'seed':>4} {'soak killed at':38} {short + ' killed at':38} wall",
    ]
    mutants = kills = own_kills = only_soak = only_own = 0
    runs = run_kills = own_run_kills = 0
    controls = silent = 0
    for name, row in rows.items():
        mutant = row["mutant"]
        if "error" in row:
            lines.append(f"{name:34} ERROR: {row['error'].splitlines()[-1:]}")
            continue
        by_soak = by_own = False
        quiet = True
        for i, run in enumerate(row["runs"]):
            soak, own = run["soak"], run[engine]
            wall = f"{row['wall_s']:.0f} s" if i == 0 else ""
            label = name if i == 0 else ""
            lines.append(f"{label:34} {run['seed']:>4} {_at(soak):38} {_at(own):38} {wall}")
            soak_kill = soak.get("steps") is not None
            own_kill = own.get("steps") is not None
            by_soak |= soak_kill
            by_own |= own_kill
            quiet &= not soak_kill and not own_kill and not soak.get("sglang_said")
            if mutant is not None and not mutant.control:
                runs += 1
                run_kills += soak_kill
                own_run_kills += own_kill
            if soak_kill:
                lines.append(f"{'':41}soak: {soak['said']}")
            if own_kill:
                lines.append(f"{'':41}{short}: {own['said']}")
        if mutant is None or mutant.control:
            controls += 1
            silent += quiet
        else:
            mutants += 1
            kills += by_soak
            own_kills += by_own
            only_soak += by_soak and not by_own
            only_own += by_own and not by_soak
    lines += [
        f"kill rate (any seed): soak {kills}/{mutants}, {alone} {own_kills}/{mutants}; "
        f"only soak {only_soak}, only {short} {only_own}; per run: soak {run_kills}/{runs}, "
        f"{alone} {own_run_kills}/{runs}",
        f"silent: {silent}/{controls} controls and release",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, nargs="+", default=[0], help="one run per seed")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--wheel", default=None, help="SGLang 0.5.23 wheel or tree")
    parser.add_argument(
        "--vllm-wheel",
        default=None,
        help="vLLM wheel or tree (default: the cached 0.33.0 wheel, the release the snippets are "
        "written for; on another, a mutant none of whose snippets is found is left out and named)",
    )
    parser.add_argument("--engine", choices=("sglang", "vllm", "all"), default="all")
    parser.add_argument(
        "--layout",
        nargs="+",
        choices=[layout for engine, layout in GROUPS if engine == "sglang"],
        default=None,
        help="SGLang's layouts to mutate (default: each; swa+radix: with radix sessions; "
        "swa+hicache-tp2: with the host tier on two ranks; swa+hicache-storage-tp2: with "
        "the storage tier behind it; swa-overlap: under SGLang's overlapped loop; "
        "swa-tp2-overlap: on two ranks; swa+radix-overlap: with radix sessions)",
    )
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-engine", default="sglang", help=argparse.SUPPRESS)
    parser.add_argument("--child-layout", default="swa", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        if args.child_engine == "vllm":
            models, overlap, drafts = vllm_scheduling(args.child_layout)
            vllm_child(args.child, args.steps, args.seed, args.result, models, overlap, drafts)
        else:
            child(args.child, args.steps, args.seed, args.result, args.child_layout)
        return 0
    unknown = set(args.only) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
    figures = run_all(args)
    lines = report(figures)
    print("\n".join(lines))
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    for row in figures["variants"].values():
        mutant = row.pop("mutant")
        row["control"] = mutant is None or mutant.control
        row["what"] = "the release" if mutant is None else mutant.what
    (out / "mutants.json").write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
