"""The batch server through kills and restarts, warm engines lent across runs, and
batches that end early (cannot run, cancelled in the queue), driven by the official
clients as in ``test_batch_server``."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest
from openai.types import Batch
from openai.types.chat import ChatCompletion

from .batchserver import (
    FAKE,
    KEY,
    Server,
    anthropic_request,
    chat_line,
    finished,
    jsonl,
    openai_batch,
    output_lines,
    wait_for,
)


@pytest.mark.engine
def test_a_real_engine_server_killed_mid_batch_answers_every_request_once(models, tmp_path):
    """One server, real vLLM: an OpenAI batch and an Anthropic batch queued behind it;
    the server SIGKILLs itself at its first checkpoint and is started again on the
    same store, which finishes both (the second on the first's warm engine)."""
    args = [
        *("--set", "run.chunk_records=4", "--set", "engine.max_num_seqs=8"),
        *("--set", "engine.extra.enforce_eager=true"),
    ]
    crash = {"NIGHTSHIFT_CRASH_AT": "chunk.written:1"}
    server = Server(tmp_path / "store", models["chat"], *args, env=crash)
    server.start()
    try:
        lines = [
            chat_line(f"o-{i}", f"Ticket {i}: my invoice is wrong", max_tokens=6) for i in range(12)
        ]
        lines += ["not json", chat_line("o-0", "a repeat"), chat_line("o-x", "hi", stream=True)]
        batch = openai_batch(server.openai(), lines)
        requests = [anthropic_request(f"a-{i}", f"Summarise ticket {i}") for i in range(6)]
        mbatch = server.anthropic().messages.batches.create(requests=requests)
        assert server.proc.wait(600) == -signal.SIGKILL, server.log.read_text()[-3000:]
        server.env = {}
        server.start(timeout=120)
        client = server.openai()
        done = finished(client, batch.id)
        assert done.status == "completed", done
        out = output_lines(client, done.output_file_id)
        errors = output_lines(client, done.error_file_id)
        for line in out:
            ChatCompletion.model_validate(line["response"]["body"])
        ids = sorted(x["custom_id"] for x in out + errors if x["custom_id"] is not None)
        assert ids == sorted([f"o-{i}" for i in range(12)] + ["o-0", "o-x"])
        assert len(out) == 12 and len(errors) == 3
        assert done.request_counts.completed == 12 and done.usage.output_tokens > 0

        claude = server.anthropic()
        ended = wait_for(
            lambda: claude.messages.batches.retrieve(mbatch.id),
            lambda b: b.processing_status == "ended",
            timeout=600,
        )
        assert ended.request_counts.succeeded == 6
        results = list(claude.messages.batches.results(mbatch.id))
        assert sorted(r.custom_id for r in results) == sorted(f"a-{i}" for i in range(6))
        assert all(r.result.type == "succeeded" for r in results)
    finally:
        server.stop()


def test_warm_engines_lend_one_engine_to_runs_of_the_same_settings(models, tmp_path):
    """What keeps the server's engine up between batches: the same engine settings get
    the same engine back; a discarded (crashed) or stopped one is closed, never lent."""
    from nightshift.jobs.spec import JobSpec
    from nightshift.running import engines

    from .conftest import spec_dict

    def spec(**engine) -> JobSpec:
        data = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out")
        data["run"] = {"engine": "fake"}
        data["engine"] = {**data["engine"], **engine}
        return JobSpec.model_validate(data)

    with engines.warm_engines():
        first = engines.build_engine(spec())
        inner = first._engine
        first.close()
        again = engines.build_engine(spec())
        assert again._engine is inner  # handed back, lent again
        again.discard()
        again.close()
        assert engines.build_engine(spec())._engine is not inner  # a discarded one is gone
        other = engines.build_engine(spec(max_num_seqs=8))
        assert other._engine is not inner
    assert engines.build_engine(spec()).__class__.__name__ == "FakeEngine"  # off outside


def _flow_run(input_file_id: str):
    """The Prefect flow run of the batch over ``input_file_id`` (its job is named after
    the input file), from the test session's Prefect server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        [run] = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"batch-{input_file_id}-"))
        )
    return run


def test_batches_that_cannot_run_fail_validating_and_queued_cancels_end_at_once(serve):
    """OpenAI fails a batch whose input cannot run while validating, with ``errors``;
    a cancel ends a batch still in the queue at once; each batch is a Prefect flow run,
    one at a time; files list and delete; the key never reaches the log; a bug in a
    handler is a 500 in OpenAI's shape, without a traceback."""
    server = serve(*FAKE, env={"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.05"})
    client = server.openai()

    def create(content: bytes, endpoint: str = "/v1/chat/completions") -> Batch:
        uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
        return client.batches.create(
            input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h"
        )

    with pytest.raises(openai.BadRequestError, match="metadata"):
        client.batches.create(
            input_file_id=client.files.create(file=("m.jsonl", b"{}\n"), purpose="batch").id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"n": 1},  # type: ignore[dict-item]
        )
    empty = create(b"\n")
    not_jsonl = create(b"hello\nworld\n")
    wrong_endpoint = create(jsonl([chat_line("c", "hi")]), endpoint="/v1/completions")
    slow = create(jsonl([chat_line(f"s-{i}", f"count to {i}") for i in range(300)]))
    queued = create(jsonl([chat_line("q", "never runs")]))
    last = create(jsonl([chat_line(f"l-{i}", f"hello {i}", max_tokens=4) for i in range(3)]))
    for batch, code in (
        (empty, "empty_file"),
        (not_jsonl, "invalid_json_line"),
        (wrong_endpoint, "mismatched_endpoint"),
    ):
        failed = finished(client, batch.id)
        assert failed.status == "failed" and failed.failed_at and not failed.in_progress_at
        assert failed.errors and failed.errors.data[0].code == code, failed.errors
        assert failed.output_file_id is None and failed.error_file_id is None
    wait_for(lambda: client.batches.retrieve(slow.id), lambda b: b.status == "in_progress")
    assert client.batches.cancel(queued.id).status == "cancelled"  # not once slow ends
    assert client.batches.retrieve(queued.id).cancelled_at
    client.batches.cancel(slow.id)
    assert finished(client, slow.id).status == "cancelled"
    assert finished(client, last.id).status == "completed"
    first, second = _flow_run(slow.input_file_id), _flow_run(last.input_file_id)
    assert first.state.is_final() and second.state.is_completed()
    assert first.end_time <= second.start_time  # one batch at a time

    listed = client.files.list(purpose="batch")
    assert last.input_file_id in [f.id for f in listed] and listed.data[0].id == listed.first_id
    assert client.files.delete(empty.input_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(empty.input_file_id)
    assert client.models.retrieve("demo").id == "demo"
    (server.store / "files" / f"{last.input_file_id}.jsonl").unlink()  # a broken store
    broken = httpx.get(
        f"{server.url}/v1/files/{last.input_file_id}/content",
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert broken.status_code == 500 and broken.json()["error"]["type"] == "server_error"
    assert "Traceback" not in broken.text
    with pytest.raises(openai.AuthenticationError):
        server.openai("sk-wrong").batches.list()
    assert KEY not in server.log.read_text() and "sk-wrong" not in server.log.read_text()


def test_a_server_killed_while_finalizing_finishes_each_batch_once_in_order(serve):
    """SIGKILLed after a batch's job ended, as it writes the results, with another batch
    queued: the next start finalizes the first again (same files) and runs the second."""
    server = serve(*FAKE, env={"NIGHTSHIFT_CRASH_AT": "batch.finalizing"})
    client = server.openai()
    first = openai_batch(client, [chat_line(f"a-{i}", f"hi {i}", max_tokens=4) for i in range(8)])
    second = openai_batch(client, [chat_line(f"b-{i}", f"yo {i}", max_tokens=4) for i in range(4)])
    assert server.proc.wait(120) == -signal.SIGKILL
    server.env = {}
    server.start()
    client = server.openai()
    done = [finished(client, b.id) for b in (first, second)]
    assert [b.status for b in done] == ["completed", "completed"]
    assert done[0].completed_at <= done[1].in_progress_at  # first in, first out
    for batch, prefix, n in ((done[0], "a", 8), (done[1], "b", 4)):
        ids = [x["custom_id"] for x in output_lines(client, batch.output_file_id)]
        assert sorted(ids) == sorted(f"{prefix}-{i}" for i in range(n))
        assert batch.request_counts.completed == n and batch.error_file_id is None
