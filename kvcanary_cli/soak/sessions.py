"""A client's sessions, opened and continued the way SGLang's scheduler does it.

A server opens a session (`open_session`: SGLang's `Session`, not streaming) and makes each
turn of it with `Session.create_req`: the turn names the turn it continues
(`session_params.rid`), and its request's prompt is that turn's prompt and output, then the
new tokens. The request carries its session (`req.session`), which changes one thing in the
memory cache's handling: a session request the prefill adder turns down keeps the
copy-on-write Mamba slot its prefix match took (SGLang's `get_new_batch_prefill` frees it for
any other request), so aborting it while it waits releases the slot through
`release_kv_cache` with no KV held. Streaming sessions, which keep a turn's request pool row
and KV between turns, are not driven.

Closing a session frees nothing of the memory cache when it is not streaming (its requests
hold nothing once over), so soak never closes one.
"""

from __future__ import annotations

import inspect
from array import array
from dataclasses import dataclass
from importlib import import_module
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


class Sessions:
    """The sessions of one history, by the workload's session number."""

    def __init__(self, vocab_size: int) -> None:
        self._session_class = import_module(_CONTROLLER).Session
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

    def dropped(self, req: Any) -> None:
        """The client aborted `req` while it waited, or SGLang dropped it unfinished: its
        session's turn is over, and the next one continues the turn before it."""
        for one in self._open.values():
            if one.turn is req:
                one.turn = None

    def turn(self, number: int, rid: str, prompt: tuple[int, ...], sampling: Any) -> Any:
        """The next turn of session `number` (opened at its first), as SGLang's scheduler makes
        it: `Session.create_req`, continuing the session's last finished turn."""
        one = self._open.get(number)
        if one is None:
            name = f"soak-session-{number}"
            one = self._open[number] = _Open(self._session_class(0, name, streaming=False))
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
        one.turn = req
        return req
