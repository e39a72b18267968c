"""The storage tier's pieces under soak (`soak.storage`), without SGLang: the parked threads and
the pump that runs their loops in soak's thread, the folder soak makes and removes, the
workload's prefetch policy (JSON, refusals) and the options it needs.

The pump's twins: loops shaped as the controller's (a stop event polled before each get)
drained in the order work flows, the stop event put back; a queue with nothing in it runs no
loop at all."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from queue import Queue
from typing import Any

import pytest

from kvcanary_cli.errors import OptionError
from kvcanary_cli.soak import storage
from kvcanary_cli.soak.workload import PREFETCH_POLICIES, WRITE_POLICIES, Workload


class _Controller:
    """A controller's storage side as the pump sees it: four queues, four loops that poll the
    stop event before each get (as SGLang's do), each loop handing work to the next."""

    def __init__(self) -> None:
        self.storage_stop_event: Any = object()
        self.backup_queue: Queue[int] = Queue()
        self.prefetch_queue: Queue[int] = Queue()
        self.prefetch_buffer: Queue[int] = Queue()
        self.prefetch_sync_queue: Queue[int] = Queue()
        self.acks: list[tuple[str, int]] = []
        self.backup_thread = storage._ParkedThread(target=self._loop("backup", "backup_queue"))
        self.prefetch_thread = storage._ParkedThread(
            target=self._loop("query", "prefetch_queue", "prefetch_buffer")
        )
        self.prefetch_io_aux_thread = storage._ParkedThread(
            target=self._loop("read", "prefetch_buffer", "prefetch_sync_queue")
        )
        self.prefetch_sync_thread = storage._ParkedThread(
            target=self._loop("ack", "prefetch_sync_queue")
        )

    def _loop(self, name: str, source: str, then: str | None = None) -> Any:
        def loop() -> None:
            while not self.storage_stop_event.is_set():
                item = getattr(self, source).get(block=True, timeout=1)
                self.acks.append((name, item))
                if then is not None:
                    getattr(self, then).put(item)

        return loop


def test_the_pump_runs_each_loop_until_its_queue_is_empty_in_the_order_work_flows() -> None:
    controller = _Controller()
    stop = controller.storage_stop_event
    controller.prefetch_queue.put(7)
    controller.backup_queue.put(1)
    controller.backup_queue.put(2)
    pump = storage.StoragePump(controller)
    pump.run()
    assert controller.acks == [
        ("backup", 1),
        ("backup", 2),
        ("query", 7),
        ("read", 7),
        ("ack", 7),
    ]
    assert controller.storage_stop_event is stop  # put back
    assert pump.runs == {
        "backup_thread": 1,
        "prefetch_thread": 1,
        "prefetch_io_aux_thread": 1,
        "prefetch_sync_thread": 1,
    }
    assert all(
        q.empty()
        for q in (controller.prefetch_queue, controller.prefetch_buffer, controller.backup_queue)
    )


def test_the_pump_runs_no_loop_with_nothing_queued() -> None:
    controller = _Controller()
    pump = storage.StoragePump(controller)
    pump.run()
    assert controller.acks == []
    assert pump.runs == {}


def test_a_parked_thread_never_starts_its_target() -> None:
    ran: list[int] = []
    thread = storage._ParkedThread(target=lambda: ran.append(1), daemon=True)
    thread.start()
    thread.join(timeout=1)
    assert ran == []
    assert not thread.is_alive()
    assert thread.target is not None


def test_the_threading_seen_by_the_controller_is_threadings_but_for_thread() -> None:
    import threading

    seen = storage._Threading()
    assert seen.Thread is storage._ParkedThread
    assert seen.Event is threading.Event
    assert seen.Lock is threading.Lock


def test_the_folder_is_in_the_temporary_folder_and_close_removes_it() -> None:
    tier = storage.StorageTier(storage.storage_folder())
    folder = Path(tier.folder.name)
    assert folder.parent == Path(tempfile.gettempdir())
    assert folder.resolve() != Path.cwd().resolve()
    (folder / "page.bin").write_bytes(b"kv")
    tier.close()
    assert not folder.exists()


def test_the_folder_variable_names_soaks_folder_while_the_backend_is_built_and_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(storage._FOLDER_ENV, "/somewhere/of/the/users")
    with storage.backend_context("/tmp/soaks"):
        assert os.environ[storage._FOLDER_ENV] == "/tmp/soaks"
    assert os.environ[storage._FOLDER_ENV] == "/somewhere/of/the/users"
    monkeypatch.delenv(storage._FOLDER_ENV)
    with storage.backend_context("/tmp/soaks"):
        assert os.environ[storage._FOLDER_ENV] == "/tmp/soaks"
    assert storage._FOLDER_ENV not in os.environ


def test_server_args_name_the_file_backend_its_folder_and_the_prefetch_policy() -> None:
    fields = storage.server_args_fields("/tmp/x", "wait_complete")
    assert fields["hicache_storage_backend"] == "file"
    assert fields["hicache_storage_prefetch_policy"] == "wait_complete"
    extra = json.loads(fields["hicache_storage_backend_extra_config"])
    assert extra == {
        "prefetch_threshold": storage.PREFETCH_THRESHOLD,
        "file_storage_path": "/tmp/x",
    }


def _workload(**fields: Any) -> Workload:
    return Workload(seed=3, arrivals=(), steps=10, **fields)


@pytest.mark.parametrize("policy", PREFETCH_POLICIES)
def test_a_workloads_prefetch_policy_survives_json(policy: str) -> None:
    workload = _workload(hicache_write_policy=WRITE_POLICIES[0], hicache_storage=policy)
    assert Workload.from_json(workload.to_json()).hicache_storage == policy


def test_a_file_before_the_storage_tier_reads_as_none() -> None:
    data = json.loads(_workload().to_json())
    del data["hicache_storage"]
    assert Workload.from_json(json.dumps(data)).hicache_storage is None


@pytest.mark.parametrize(
    ("write", "prefetch"), [(WRITE_POLICIES[0], "timeout"), (None, "best_effort")]
)
def test_an_unknown_prefetch_policy_or_one_without_a_host_tier_is_refused(
    write: str | None, prefetch: str
) -> None:
    data = json.loads(_workload().to_json())
    data["hicache_write_policy"] = write
    data["hicache_storage"] = prefetch
    with pytest.raises(TypeError):
        Workload.from_json(json.dumps(data))


def test_histories_take_the_prefetch_policies_by_round_without_streaming_sessions() -> None:
    from kvcanary_cli.soak.command import history_workload

    drawn = [history_workload(0, h, 1, hicache=True, storage=True) for h in range(6)]
    rounds = len(WRITE_POLICIES)
    assert [w.hicache_storage for w in drawn] == [
        PREFETCH_POLICIES[(h // rounds) % len(PREFETCH_POLICIES)] for h in range(6)
    ]
    assert not any(w.streaming_sessions for w in drawn)
    assert history_workload(0, 0, 1, hicache=True).hicache_storage is None
    assert history_workload(0, 0, 1, storage=True).hicache_storage is None


@pytest.mark.parametrize("tp", [1, 2])
def test_the_storage_tier_needs_the_host_tier_on_any_ranks(tmp_path: Path, tp: int) -> None:
    """Refused without --hicache, on one rank or several; --tp itself is no longer refused
    (tests/integration/test_soak_tp_hicache_storage.py runs it)."""
    from kvcanary_cli.soak.command import soak

    with pytest.raises(OptionError, match="add --hicache$"):
        soak(sglang_tree=None, steps=10, seed=0, out=tmp_path / "out", hicache_storage=True, tp=tp)


def test_the_storage_fault_is_refused_without_the_storage_tier() -> None:
    from types import SimpleNamespace

    from kvcanary_cli.soak.faults import plant
    from kvcanary_cli.soak.stack import SGLangUnavailableError

    label = SimpleNamespace(label="tree")
    stack = SimpleNamespace(
        tree=SimpleNamespace(cache_controller=object()),
        storage=None,
        modules=SimpleNamespace(tree=label),
    )
    with pytest.raises(SGLangUnavailableError, match="--hicache-storage"):
        plant("storage-ack-frees-host", stack)
