"""A client's sessions, opened and continued the way SGLang's scheduler does it.

A server opens a session through SGLang's `SessionController` (`open`) and makes each turn
of it with `Session.create_req`: the turn continues the session's last finished turn (named
by `session_params.rid`; a streaming session keeps its one last turn itself), and its
request's prompt is that turn's prompt and output, then the new tokens. The request carries
its session (`req.session`).

A client session (not streaming) changes one thing in the memory cache's handling: a session
request the prefill adder turns down keeps the copy-on-write Mamba slot its prefix match took
(SGLang's `get_new_batch_prefill` frees it for any other request), so aborting it while it
waits releases the slot through `release_kv_cache` with no KV held. Closing one frees nothing
(its requests hold nothing once over), so soak never closes it.

A streaming session (`--enable-streaming-session`) keeps its turn's KV record between turns:
the tree takes the first turn's request pool row, its KV past the tree's part and its prefix
lock at the row's allocation, each later turn borrows them, a finished or retracted turn
leaves them with the session, and an aborted turn takes them back and is released like any
request (the session starts over at its next turn). Closing it (`SessionController.close`)
frees its row, its own KV and its lock (`release_session`). Soak closes a streaming session
once its last turn is over, but the first, which it keeps open a few idle steps once the rest
of the history is served (`driver.SESSION_LINGER`), so idle steps meet a session that holds
KV (between turns idle steps are rare, and a session kept open longer holds its pages and
locks its prefix: on soak's small pools a few such sessions hold every SWA page and the
waiting requests never fit, on SGLang's scheduler too).

Radix sessions (`--enable-session-radix-cache`, `radix`) are client sessions the tree knows
of: opening one opens its radix session (`open_radix_session`, as the scheduler's
`open_session` does), each turn carries the session's generation
(`ensure_session_generation`, as the scheduler sets it on the request `create_req` made), a
finished turn's insert tags the nodes it ended on with the session (the tree then evicts them
last), and closing it drops the tags (`release_radix_session`, then `SessionController.close`,
as the scheduler's `close_session` does). They hold no row, no lock and no KV outside the
tree: a tagged node is the tree's, evictable like any other. Soak closes them as it closes
streaming sessions, but one (number 1), which it closes once its last turn is made, while
that turn may still run: the turn's insert then finds its session closed and tags nothing.
"""

from __future__ import annotations

import inspect
from array import array
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace
from typing import Any

__all__ = ["Sessions"]

_CONTROLLER = "sglang.srt.session.session_controller"
_IO = "sglang.srt.managers.io_struct"


@dataclass
class _Open:
    """One open session: SGLang's `Session`, its turn in flight, the last turn that finished."""

    session: Any
    turn: Any = None
    finished: str | None = None
    #: turns made so far
    made: int = 0


def session_controller(tree: Any) -> Any:
    """SGLang's `SessionController` over `tree` (the server's sessions, which its pool
    statistics count and whose close releases a streaming session's KV)."""
    return import_module(_CONTROLLER).SessionController(tree)


class Sessions:
    """The sessions of one history, by the workload's session number: client sessions, or
    streaming ones (`streaming`), or client ones under radix sessions (`radix`); the last
    two closed once their `turns` (turns per session) are over."""

    def __init__(
        self,
        vocab_size: int,
        controller: Any,
        *,
        streaming: bool = False,
        turns: dict[int, int] | None = None,
        radix: bool = False,
    ) -> None:
        self._controller = controller
        self._streaming = streaming
        self._radix = radix
        self._turns = turns or {}
        io = import_module(_IO)
        self._request = io.TokenizedGenerateReqInput
        self._params = io.SessionParams
        self._fields = set(inspect.signature(self._request).parameters)
        self._vocab = vocab_size
        self._open: dict[int, _Open] = {}

    def ready(self, number: int) -> bool:
        """Whether session `number` may take its next turn: its turn before is over."""
        one = self._open.get(number)
        if one is None or one.turn is None:
            return True
        if one.turn.finished():
            one.finished, one.turn = one.turn.rid, None
            return True
        return False

    @property
    def streaming(self) -> bool:
        """Whether the sessions are streaming ones."""
        return self._streaming

    @property
    def closing(self) -> bool:
        """Whether soak closes the sessions: streaming or radix ones (closing a plain client
        session frees nothing)."""
        return self._streaming or self._radix

    def open_count(self) -> int:
        """Sessions not yet closed, of those soak closes (`closing`)."""
        return len(self._open) if self.closing else 0

    def _close(self, session_id: str) -> None:
        """Close a session as the scheduler's `close_session` does: the tree's radix session
        first (radix sessions), then the controller's, whose close releases both."""
        if self._radix:
            self._controller.tree_cache.release_radix_session(session_id)
        self._controller.close(SimpleNamespace(session_id=session_id))

    def close_over(self, *, all_over: bool) -> int:
        """Close (`_close`) each session soak closes (`closing`) whose turns are all made and
        over: the first session (number 0) only once `all_over` (nothing else is left of
        the history: it holds its KV through the idle steps before), the others at once; a
        radix session number 1 once its turns are made, its last maybe still running.
        Returns how many it closed."""
        if not self.closing:
            return 0
        closed = 0
        for number, one in list(self._open.items()):
            if one.made < self._turns.get(number, 0):
                continue
            early = self._radix and number == 1
            if not early and not self.ready(number):
                continue
            if number == 0 and not all_over:
                continue
            self._close(one.session.session_id)
            del self._open[number]
            closed += 1
        return closed

    def dropped(self, req: Any) -> None:
        """The client aborted `req` while it waited, or SGLang dropped it unfinished: its
        session's turn is over, and the next one continues the turn before it. A streaming
        session's turn aborted while it waits clears the session's turn in flight, as
        SGLang's `_release_aborted_request` does (0.5.21 on; before, such a session refused
        every later turn: soak clears it on every release, as a client that reopens would)."""
        for one in self._open.values():
            if one.turn is req:
                one.turn = None
                session = getattr(req, "session", None)
                if session is not None and session.streaming:
                    session.abort_req()

    def turn(self, number: int, rid: str, prompt: tuple[int, ...], sampling: Any) -> Any:
        """The next turn of session `number` (opened at its first), as SGLang's scheduler makes
        it: `Session.create_req`, continuing the session's last finished turn."""
        one = self._open.get(number)
        if one is None:
            name = f"soak-session-{number}"
            opened = SimpleNamespace(
                session_id=name, capacity_of_str_len=0, streaming=self._streaming, timeout=None
            )
            self._controller.open(opened)
            if self._radix:
                self._controller.tree_cache.open_radix_session(name)
            one = self._open[number] = _Open(self._controller.get(name))
        params = self._params(id=one.session.session_id, rid=one.finished)
        given = {
            "rid": rid,
            "input_text": "",
            "input_ids": array("q", prompt),
            "input_embeds": None,
            "mm_inputs": None,
            "token_type_ids": None,
            "sampling_params": sampling,
            "return_logprob": False,
            "logprob_start_len": -1,
            "top_logprobs_num": 0,
            "token_ids_logprob": None,
            "stream": False,
            "session_params": params,
        }
        request = self._request(**{k: v for k, v in given.items() if k in self._fields})
        req = one.session.create_req(request, None, self._vocab)
        if self._radix:
            tree = self._controller.tree_cache
            req.session_generation = tree.ensure_session_generation(one.session.session_id)
        one.turn = req
        one.made += 1
        return req
