"""A resume loads its tokenizer by the class its plan recorded (no AutoTokenizer, so no
torch on the fake engine), and does so with its encoding processes' start while
Prefect's server boots (``runner.resume_ahead``, ``pipelines.headstart``)."""

from __future__ import annotations

import json
import pickle

import pytest

from nightshift.engines.tokenizerid import TokenizerIdentity
from nightshift.jobs.loading import load_spec
from nightshift.running import encoding, runner
from nightshift.scheduling.dryrun import plan_summary

from .conftest import spec_dict
from .test_encoding_processes import _gone, _spare_pids


@pytest.fixture
def planned(models, ticket_dir, tmp_path, write_spec):
    """A spec file whose plan is written and no shard run: what a resume starts from."""

    def make(**run):
        data = spec_dict(models["chat"], ticket_dir, tmp_path / "out")
        data["run"] = {"engine": "fake", "encode_processes": 1, **run}
        path = write_spec(data)
        plan_summary(load_spec(path), write=True)
        return path

    return make


def _no_auto_tokenizer(monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("AutoTokenizer was used")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


def _spy(monkeypatch, module, name) -> list:
    """Calls of ``module.name``, each as whether it ran inside the job's flow."""
    from prefect.context import FlowRunContext

    calls, real = [], getattr(module, name)

    def spying(*args, **kwargs):
        calls.append("in the flow" if FlowRunContext.get() else "ahead")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spying)
    return calls


def test_a_resume_loads_its_tokenizer_and_processes_once_ahead_without_autotokenizer(
    planned, tmp_path, monkeypatch
):
    from nightshift.pipelines.local import run_flow_once

    spec_path = planned()
    recorded = json.loads((tmp_path / "out" / "plan" / "plan.json").read_text())["tokenizer"]
    assert recorded["module"].startswith("transformers.") and len(recorded["digest"]) == 64
    _no_auto_tokenizer(monkeypatch)
    loads = _spy(monkeypatch, runner, "load_encoder")
    starts = _spy(monkeypatch, encoding, "_start_children")
    report = run_flow_once(str(spec_path), None, verbose=True)
    assert report["records"]["ok"] == 120
    # one load and one set of processes, in the head start; the run took both
    assert loads == ["ahead"] and starts == ["ahead"]
    assert runner._ahead == {} and encoding._spares == {}


def test_nothing_is_loaded_ahead_where_the_run_will_not_resume(planned, models, tmp_path):
    from nightshift.pipelines.local import run_flow_once

    spec_path = planned()
    changed = load_spec(spec_path, ["prompt.system=Label it."])  # another job: refused
    assert not runner.resume_ahead(changed) and runner._ahead == {}
    run_flow_once(str(spec_path), None, verbose=True)
    assert not runner.resume_ahead(load_spec(spec_path))  # all committed: nothing to resume
    fresh = load_spec(spec_path, [f"output.path={tmp_path / 'elsewhere'}"])
    assert not runner.resume_ahead(fresh) and encoding._spares == {}


def test_what_no_run_took_is_dropped_with_its_processes(planned):
    spec = load_spec(planned())
    assert runner.resume_ahead(spec)
    started = _spare_pids(spec)
    assert len(started) == 1 and pickle.dumps(spec) in runner._ahead
    runner.drop_ahead(spec)
    assert runner._ahead == {} and _spare_pids(spec) == [] and _gone(started)


def test_a_plan_without_a_recorded_tokenizer_resumes_through_autotokenizer():
    assert TokenizerIdentity.in_plan(None) is None
    assert TokenizerIdentity.in_plan({"fingerprint": "x"}) is None  # an older plan
    assert TokenizerIdentity.in_plan({"tokenizer": {"module": "m"}}) is None  # a damaged one
    known = TokenizerIdentity("transformers.x", "Y", "d")
    assert TokenizerIdentity.in_plan(known.as_plan()) == known
