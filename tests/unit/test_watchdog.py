"""The watchdog's logic with a fake clock: limits per phase, the line it prints, what it does
when a phase outlasts its limit or a peer says it stops, and rank 0's heartbeat board."""
import json
import socket
import time

import pytest

from hvdcls.training import heartbeat, watchdog
from hvdcls.training.watchdog import Phases, Watchdog


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def stepped(timeout=10.0):
    """Phases past their first step (the start-up allowance spent), at step 4."""
    clock = Clock()
    phases = Phases(timeout, clock)
    phases.enter(watchdog.COMPUTING, 4)
    phases.step_done(4)
    return clock, phases


def test_a_phase_is_overdue_only_past_its_limit():
    clock, phases = stepped()
    phases.enter(watchdog.READING, 5)
    clock.now += 10.0
    assert phases.overdue() is None  # at the limit, not past it
    clock.now += 0.5
    stall = phases.overdue()
    assert (stall.phase, stall.step) == (watchdog.READING, 5)
    assert stall.in_phase == pytest.approx(10.5) and stall.since_step == pytest.approx(10.5)


def test_a_completed_step_or_an_evaluation_batch_restarts_the_clock():
    clock, phases = stepped()
    phases.enter(watchdog.EVALUATING)
    for _ in range(5):
        clock.now += 9.0
        phases.beat()
    assert phases.overdue() is None  # 45 s evaluating, never 10 s without a batch
    clock.now += 11.0
    stall = phases.overdue()
    assert stall.phase == watchdog.EVALUATING and stall.since_step == pytest.approx(56.0)


def test_the_first_step_and_checkpoints_get_the_slow_allowance_waiting_ranks_a_grace():
    clock = Clock()
    phases = Phases(10.0, clock)
    assert phases.limit(watchdog.READING) == 10.0 * watchdog.SLOW_FACTOR  # no step yet
    phases.step_done(0)
    assert phases.limit(watchdog.READING) == 10.0
    assert phases.limit(watchdog.CHECKPOINTING) == 10.0 * watchdog.SLOW_FACTOR
    assert phases.limit(watchdog.ALLREDUCE) == 10.0 + watchdog.grace(10.0)
    assert phases.limit(watchdog.IN_STEP) > phases.limit(watchdog.COMPUTING)
    assert phases.limit(watchdog.RESETTING) is None  # Horovod's elastic timeout bounds it
    phases.restart()  # a new elastic world: its first step is slow again
    assert phases.where.phase == watchdog.STARTING
    assert phases.limit(watchdog.READING) == 10.0 * watchdog.SLOW_FACTOR
    phases.step_done(1)
    phases.slow_until_step(watchdog.READING, 0)  # a new epoch: so is its first step
    assert phases.limit(watchdog.ALLREDUCE) == 10.0 * watchdog.SLOW_FACTOR + watchdog.grace(10.0)


def test_timeout_zero_never_fires():
    clock = Clock()
    phases = Phases(0, clock)
    clock.now += 1e9
    assert phases.overdue() is None


def test_the_line_names_rank_host_phase_and_seconds():
    stall = watchdog.Stall(watchdog.READING, 3, 598.2, 600.4)
    assert watchdog.stall_line(1, "worker2", stall) == \
        "rank 1 (worker2): no step for 600 s, stuck reading data (step 3) for 598 s"


class Ended(Exception):
    pass


def ending(status):
    raise Ended(status)


def test_an_overdue_phase_writes_the_last_record_then_ends_with_the_distinct_status(capsys):
    clock, phases = stepped()
    dog = Watchdog(phases, 0, "worker1", end=ending)
    records = []
    dog.last_record = records.append
    phases.enter(watchdog.CHECKPOINTING)
    clock.now += 29.0
    dog.tick()  # within 3 x 10 s
    clock.now += 2.0
    with pytest.raises(Ended) as ended:
        dog.tick()
    assert ended.value.args == (watchdog.EXIT_STALLED,)
    assert records[0]["rank"] == 0 and records[0]["phase"] == watchdog.CHECKPOINTING
    assert "hvdcls: watchdog: rank 0 (worker1): no step for 31 s, stuck checkpointing (step 4)" \
        in capsys.readouterr().err


def test_a_failing_last_record_still_ends_the_process(capsys):
    clock, phases = stepped()
    dog = Watchdog(phases, 0, "worker1", end=ending)

    def broken(stop):
        raise OSError("disk full")

    dog.last_record = broken
    clock.now += 11.0
    with pytest.raises(Ended):
        dog.tick()
    assert "could not write the last record" in capsys.readouterr().err


def test_the_exit_status_is_distinct():
    from hvdcls import errors

    assert watchdog.EXIT_STALLED not in (errors.EXIT_OK, errors.EXIT_FAILURE, errors.EXIT_USER_ERROR,
                                         3, 130)  # 3: the test hooks' own


def send(board, message):
    board.take(message, ("127.0.0.1", 9))


def test_rank_0s_board_names_the_ranks_that_went_silent():
    clock = Clock()
    board = heartbeat.Board(3, clock, bind_host="127.0.0.1")
    try:
        send(board, {"kind": "beat", "rank": 1, "host": "w2", "phase": "computing", "step": 5})
        send(board, {"kind": "beat", "rank": 2, "host": "w3", "phase": "reading data", "step": 5})
        clock.now += 2.0
        assert board.silent_phrase() is None and board.newly_silent() == []
        send(board, {"kind": "beat", "rank": 2, "host": "w3", "phase": "computing", "step": 6})
        clock.now += heartbeat.SILENT_SECONDS
        assert board.newly_silent() == ["rank 1 (w2): no heartbeat for 12 s (last: computing, step 5)"]
        assert board.newly_silent() == []  # said once
        assert board.silent_phrase() == ("rank 1 (w2): no heartbeat for 12 s (last: computing, step 5); "
                                         "rank 2 (w3): no heartbeat for 10 s (last: computing, step 6)")
        send(board, {"kind": "beat", "rank": 7, "host": "?", "phase": "x"})  # not of this world
        assert set(board.peers) == {1, 2}
    finally:
        board.close()


def test_a_rank_never_heard_from_is_named_too():
    clock = Clock()
    board = heartbeat.Board(2, clock, bind_host="127.0.0.1")
    clock.now += 20.0
    assert board.silent_phrase() == "rank 1: no heartbeat for 20 s (none received)"
    board.close()


def test_heartbeats_and_a_stop_travel_over_udp_and_rank_0_acknowledges(capsys):
    """Real sockets on loopback: a rank's watchdog stops, rank 0 hears it, records it, acks."""
    clock0, phases0 = stepped()
    phases0.enter(watchdog.ALLREDUCE, 5)
    board = heartbeat.Board(2, bind_host="127.0.0.1")
    sender = heartbeat.Sender(("127.0.0.1", board.port))
    rank0 = Watchdog(phases0, 0, "w1", board=board, end=ending)
    records = []
    rank0.last_record = records.append
    try:
        sender.beat(1, "w2", {"phase": "reading data", "step": 5, "in_phase": 1.0})
        board.listen(0.5, print)
        assert (board.peers[1].host, board.peers[1].phase) == ("w2", "reading data")
        stop = {"by": "watchdog", "rank": 1, "host": "w2", "message": "rank 1 (w2): stuck"}
        sender._send({"kind": "stop", "rank": 1, "host": "w2", "stop": stop})
        with pytest.raises(Ended):
            rank0.tick()
        assert records == [stop]
        assert "rank 0 (w1): waiting in the all-reduce (step 5)" in capsys.readouterr().err
        assert json.loads(sender.sock.recv(1024)) == {"kind": "ack"}
    finally:
        sender.close()
        board.close()


def test_a_sender_never_raises_into_training():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    sender = heartbeat.Sender(("127.0.0.1", port))  # nobody listens there
    sender.beat(1, "w2", {"phase": "computing", "step": 1, "in_phase": 0.0})
    assert sender.stopping(1, "w2", {"message": "x"}, wait=0.2) is False
    sender.close()
    sender.beat(1, "w2", {})  # closed: still no exception


def test_start_without_a_timeout_starts_no_thread_and_shares_nothing():
    shared = []
    dog = watchdog.start(0, 0, 2, shared.append, host="w1")
    assert not dog.thread.is_alive() and shared == [] and dog.board is None
    dog.stop()


def test_start_shares_rank_0s_address_and_the_others_send_to_it():
    rank0 = watchdog.start(30, 0, 2, lambda address: address, host="w1")
    try:
        address = rank0.board.sock.getsockname()
        rank1 = watchdog.start(30, 1, 2, lambda _: ("127.0.0.1", address[1]), host="w2")
        assert rank1.sender.address == ("127.0.0.1", address[1]) and rank1.board is None
        rank1.stop()
    finally:
        rank0.stop()


def test_a_negative_timeout_is_refused_in_one_line():
    from hvdcls import config as cfg
    from hvdcls.errors import UserError

    with pytest.raises(UserError, match=r"^config training.stall_timeout_seconds=-1.0: must be >= 0$"):
        cfg.load(overrides=["training.stall_timeout_seconds=-1"])


def test_the_shutdown_line_names_the_silent_rank_and_blames_no_stall_shutdown_under_gloo():
    from hvdcls.backend import Context
    from hvdcls.training.run import shutdown_message

    gloo0 = Context("torch", 0, 2, 0, 2, "gloo", "cpu", 1)
    mpi1 = Context("torch", 1, 2, 1, 2, "mpi", "cpu", 1)
    silent = "rank 1 (w2): no heartbeat for 31 s (last: computing, step 5)"
    assert shutdown_message(gloo0, silent) == ("rank 0: Horovod shut the job down while this rank "
                                               f"waited in a collective: {silent}")
    assert "stall" not in shutdown_message(gloo0, None)
    assert "Missing ranks: N!" in shutdown_message(mpi1, None)  # MPI: the inspector may have spoken


def test_the_stall_hook_holds_in_the_read_of_its_steps_batch_only(monkeypatch):
    """HVDCLS_TEST_STALL holds inside EpochBatches' read, where a loader worker runs it."""
    from hvdcls.training import faults
    from tests.cases.batches import epoch_batches

    held = []
    monkeypatch.setattr(faults, "_hold", held.append)
    environ = {faults.STALL: "1:3"}
    rank0, rank1 = (faults.StepHooks.read(rank, environ) for rank in (0, 1))
    batches = epoch_batches({"preset": "none"}, {})  # 4 micro-batches
    assert rank0.stalling(batches, 0, 1, True) is batches  # another rank
    assert rank1.stalling(batches, 0, 1, False) is batches  # a later epoch
    assert rank1.stalling(batches, 4, 1, True) is batches  # step 3 is not among these
    assert faults.StepHooks.read(1, {}).stalling(batches, 0, 1, True) is batches  # unset
    stalling = rank1.stalling(batches, 2, 2, True)  # steps 2, 3 of two micro-batches each
    for k in range(len(stalling)):  # held in the read of micro-batch 2, the first of step 3
        images, _ = stalling[k]
        assert len(held) == (k >= 2) and (images == batches[k][0]).all()
    assert held == ["rank 1 stops submitting tensors: reading the data of step 3 never returns"]
    assert stalling.readers is batches.readers  # the same readers: the watchdog sees them


def test_step_hooks_are_read_once_and_parse_every_hook():
    """A step reads no environment: what a Trainer read at its start holds for its steps."""
    from hvdcls.training import faults

    environ = {faults.STALL: "1:3", faults.FREEZE: "1:5:/tmp/x:y.pid", faults.SLOW: "1:2.5",
               faults.KILL: "1:12:/tmp/marker"}
    hooks = faults.StepHooks.read(1, environ)
    environ.clear()  # read already: later changes do not reach the steps
    assert hooks == faults.StepHooks(1, stall_step=3, freeze_step=5, freeze_pid_file="/tmp/x:y.pid",
                                     slow_factor=2.5, kill_step=12, kill_marker="/tmp/marker")
    assert faults.StepHooks.read(0, {faults.SLOW: "1:2.5", faults.STALL: "1"}) == faults.StepHooks(0)
    assert faults.StepHooks.read(1, {faults.STALL: "1"}).stall_step == 0

def test_an_overdue_read_names_the_loader_worker_asked_only_then():
    clock, phases = stepped()
    asked = []
    phases.enter(watchdog.READING, 5, lambda: asked.append(1) or "loader worker 3, pid 4242")
    clock.now += 5.0
    assert phases.overdue() is None and asked == []
    clock.now += 6.0
    stall = phases.overdue()
    assert stall.detail == "loader worker 3, pid 4242"
    assert watchdog.stall_line(1, "worker2", stall) == ("rank 1 (worker2): no step for 11 s, stuck "
                                                        "reading data (step 5, loader worker 3, pid 4242) for 11 s")
    phases.enter(watchdog.READING, 6, lambda: 1 / 0)  # a detail that fails says nothing
    clock.now += 11.0
    assert phases.overdue().detail is None
    assert watchdog.describe(watchdog.STARTING, None) == "starting"


def test_the_host_is_the_launchers_name_for_it(monkeypatch):
    monkeypatch.setenv("HOROVOD_HOSTNAME", "worker2")
    assert watchdog.host_name() == "worker2"
    monkeypatch.delenv("HOROVOD_HOSTNAME")
    assert watchdog.host_name() == socket.gethostname()


def test_elastic_rank_0_lets_a_peer_its_watchdog_ended_go_and_goes_on(capsys):
    clock0, phases0 = stepped()
    phases0.enter(watchdog.ALLREDUCE, 5)
    board = heartbeat.Board(2, bind_host="127.0.0.1")
    sender = heartbeat.Sender(("127.0.0.1", board.port))
    rank0 = Watchdog(phases0, 0, "w1", board=board, end=ending, elastic=True)
    records = []
    rank0.last_record = records.append
    try:
        stop = {"by": "watchdog", "rank": 1, "host": "w2", "message": "rank 1 (w2): stuck"}
        sender._send({"kind": "stop", "rank": 1, "host": "w2", "stop": stop})
        assert rank0.tick() is True  # it listened; no Ended: the job goes on
        assert records == [] and board.stopped is None and not rank0.done.is_set()
        err = capsys.readouterr().err
        assert "rank 1 (w2) stopped by its watchdog" in err
        assert "elastic: the job goes on without rank 1" in err
        assert json.loads(sender.sock.recv(1024)) == {"kind": "ack"}
    finally:
        sender.close()
        board.close()


def test_rewire_follows_the_elastic_world_rank_0_and_size():
    """After each reset: rank 0 (maybe another process) opens a board and announces it."""
    dog = watchdog.start(30, 1, 2, None, host="w2", elastic=True)  # before the first sync
    try:
        assert dog.sender is None and dog.board is None  # no collective allowed yet
        dog.rewire(0, 3, lambda address: address)  # this process is rank 0 now, of 3
        assert dog.rank == 0 and dog.sender is None and set(dog.board.peers) == {1, 2}
        first_port = dog.board.port
        other = watchdog.start(30, 0, 1, None, host="w3", elastic=True)
        other.rewire(2, 3, lambda _: ("127.0.0.1", first_port))  # its first beat goes at once
        deadline = time.monotonic() + 5
        while dog.heard()["2"]["beats"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # rank 0's thread takes it from the socket
        other.stop()
        assert dog.heard()["2"]["host"] == "w3" and dog.heard()["1"] == {"host": "?", "beats": 0}
        dog.rewire(1, 2, lambda _: ("127.0.0.1", first_port))  # rank 1 of 2: it sends
        assert dog.rank == 1 and dog.board is None and dog.sender.address == ("127.0.0.1", first_port)
        dog.rewire(0, 1, lambda _: pytest.fail("alone: nothing to announce"))
        assert dog.rank == 0 and dog.sender is None and dog.board is None
    finally:
        dog.stop()
    off = watchdog.start(0, 0, 2, None, elastic=True)
    off.rewire(0, 2, lambda _: pytest.fail("no watchdog: no broadcast"))
    assert off.board is None
