"""Planning at scale: `nightshift jobs plan` over millions of records on this machine.

Builds (once, cached in benchmarks/.cache/plan_scale/) two datasets of interleaved
records, in zstd Parquet files:

* fields: a unique string `id`, a `document` shared by many records (300 texts of about
  200-3000 characters) and a `question` of varied length (about 20-1500), planned with
  the template "{document}\n\nQuestion: {question}";
* single column: pre-rendered prompts of about 2 KB in one `prompt` column (template
  "{prompt}"): one of 4 instruction texts, one of 300 documents (about 1,500
  characters) and a question, so the shared part ends inside the field.

Then times `nightshift jobs plan SPEC --json` in a subprocess, and `--write --json` when
the CLI has that flag, polling the RSS of the process tree. Goal: at least 1,000,000
records per minute and a peak under 6 GB (1 GB = 1e9 bytes) for 2,000,000 records.

    .venv/bin/python benchmarks/plan_scale.py [--records 2000000] [--files 16]
        [--shape fields|column|both] [--out benchmarks/results/plan_scale.json]
        [--cache DIR] [--generate-only]

Writes benchmarks/results/plan_scale.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

try:
    import psutil
except ImportError:  # then only the wait4 high-water mark is measured
    psutil = None

ROOT = Path(__file__).resolve().parents[1]
NIGHTSHIFT = ROOT / ".venv/bin/nightshift"
# Without a venv in this checkout: the running interpreter (with PYTHONPATH for the tree).
COMMAND = [str(NIGHTSHIFT)] if NIGHTSHIFT.exists() else [sys.executable, "-m", "nightshift.cli"]
MODEL = ROOT / ".nightshift/demo-model"
DATA_VERSION = 2  # bump when the generator changes, so old caches are not reused
COLUMN_VERSION = 1  # the same, for the single-column dataset
DOCUMENTS, SEED = 300, 20240601
GOAL_RECORDS_PER_MIN, GOAL_PEAK_GB = 1_000_000, 6.0
# Words the demo tokenizer was trained on (from the demo tickets), so prompts tokenise well.
VOCABULARY = (
    "I was charged twice for my subscription this month the invoice shows a plan never signed "
    "up card declined please refund last payment export button does nothing when click app "
    "crashes every time open settings page search results deleted weeks ago uploading file "
    "fails with error dashboard chart blank after update could you add dark mode we need"
)
WORDS = VOCABULARY.split()
SYSTEM = "You answer questions about a support document. Answer in one short sentence."
TEMPLATE = "{document}\n\nQuestion: {question}"
INSTRUCTIONS = [
    "You are a support assistant. Read the document below and answer the customer's "
    f"question in one short sentence, quoting the document where you can. Variant {v}."
    for v in range(4)
]


def texts(rng: np.random.Generator, chars: np.ndarray, end: str) -> pa.Array:
    """One string of random words per target length (in characters, met to within a word
    or so), without a per-string loop: gather rows of word bytes, drop the padding."""
    table = np.array([(w + " ").encode() for w in WORDS], dtype="S").view(np.uint8)
    table = table.reshape(len(WORDS), -1)
    lengths = np.array([len(w) + 1 for w in WORDS], dtype=np.int64)
    counts = np.maximum(1, np.rint(chars / lengths.mean()).astype(np.int64))
    ids = rng.integers(0, len(lengths), int(counts.sum()))
    data = table[ids][np.arange(table.shape[1]) < lengths[ids][:, None]]
    ends = np.cumsum(lengths[ids])[np.cumsum(counts) - 1]  # where each string's words end
    data[ends - 1] = ord(end)  # the last word's trailing space becomes the end mark
    offsets = np.concatenate([[0], ends]).astype(np.int64)
    return pa.LargeStringArray.from_buffers(
        len(chars), pa.py_buffer(offsets), pa.py_buffer(data)
    ).cast(pa.string())


def file_table(rng: np.random.Generator, docs: pa.Array, start: int, count: int) -> pa.Table:
    numbers = pa.array(np.arange(start, start + count)).cast(pa.string())
    ids = pc.binary_join_element_wise("r", pc.utf8_lpad(numbers, 9, "0"), "")
    chars = np.clip(rng.lognormal(np.log(110), 0.9, count), 20, 1500)
    documents = docs.take(pa.array(rng.integers(0, len(docs), count)))  # interleaved
    return pa.table({"id": ids, "document": documents, "question": texts(rng, chars, "?")})


def column_table(rng: np.random.Generator, docs: pa.Array, start: int, count: int) -> pa.Table:
    """Pre-rendered prompts: instructions, a shared document, then the record's question."""
    table = file_table(rng, docs, start, count)
    heads = pa.array(INSTRUCTIONS).take(pa.array(rng.integers(0, len(INSTRUCTIONS), count)))
    prompt = pc.binary_join_element_wise(
        heads, table["document"], table["question"], "\n\nDocument:\n"
    )
    return pa.table({"id": table["id"], "prompt": prompt})


def generate(directory: Path, records: int, files: int, shape: str = "fields") -> int:
    """Write the Parquet files; returns the bytes of text written (all columns)."""
    rng = np.random.default_rng(SEED)
    centre, widest, make = (700, 3000, file_table) if shape == "fields" else (1500, 2500, None)
    doc_chars = np.clip(
        rng.lognormal(np.log(centre), 0.2 if make is None else 0.6, DOCUMENTS), 200, widest
    )
    docs = texts(rng, doc_chars, ".")
    make = make or column_table
    per_file, text_bytes = -(-records // files), 0
    for index, start in enumerate(range(0, records, per_file)):
        table = make(rng, docs, start, min(per_file, records - start))
        pq.write_table(table, directory / f"part-{index:03d}.parquet", compression="zstd")
        text_bytes += sum(pc.sum(pc.binary_length(col)).as_py() for col in table.columns)
    return text_bytes


def dataset(cache: Path, records: int, files: int, shape: str = "fields") -> tuple[Path, bool]:
    """The cached dataset directory for these parameters, built if absent (returned with
    True when built now). Its done.json holds the text size and the build time."""
    name = f"v{DATA_VERSION}" if shape == "fields" else f"column-v{COLUMN_VERSION}"
    directory = cache / f"{name}-n{records}-f{files}-s{SEED}"
    if (directory / "done.json").exists():
        return directory, False
    cache.mkdir(parents=True, exist_ok=True)
    (cache / ".gitignore").write_text("*\n")  # never commit the generated data
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".staging-"))
    started = time.perf_counter()
    text_bytes = generate(staging, records, files, shape)
    built = {"text_bytes": text_bytes, "generate_s": round(time.perf_counter() - started, 2)}
    (staging / "done.json").write_text(json.dumps(built))
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    return directory, True


def describe(directory: Path, built_now: bool, shape: str = "fields") -> dict:
    paths = sorted(directory.glob("*.parquet"))
    return {
        "records": sum(pq.ParquetFile(p).metadata.num_rows for p in paths),
        "files": len(paths),
        "input_bytes": sum(p.stat().st_size for p in paths),
        "documents": DOCUMENTS,
        "shape": shape,
        "data_dir": str(directory),
        **json.loads((directory / "done.json").read_text()),  # text_bytes, generate_s
        "data_reused_from_cache": not built_now,
    }


def write_spec(data: Path, work: Path, shape: str = "fields") -> Path:
    template = TEMPLATE if shape == "fields" else "{prompt}"
    spec = {
        "name": "plan-scale",
        "input": {"path": str(data / "*.parquet"), "id_column": "id"},
        "prompt": {"system": SYSTEM, "template": template},
        "task": {"kind": "generate"},
        "model": {"path": str(MODEL), "max_model_len": 2048 if shape == "fields" else 4096},
        "sampling": {"max_tokens": 16},
        "output": {"path": str(work / "out")},
    }
    path = work / "plan-scale.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def tree_rss(pid: int) -> int:
    """Summed RSS of a process and its descendants now (0 without psutil)."""
    total = 0
    if psutil is None:
        return total
    with contextlib.suppress(psutil.NoSuchProcess):
        parent = psutil.Process(pid)
        for proc in [parent, *parent.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
    return total


def measure(args: list[str], work: Path) -> dict:
    """Run a command; wall time, exit code, stdout, and the peak RSS of its process tree
    (polled sum) beside the largest single process's high-water mark (wait4 rusage)."""
    peak = 0
    with open(work / "stdout", "w") as out, open(work / "stderr", "w") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err)
        while not (waited := os.wait4(proc.pid, os.WNOHANG))[0]:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.1)
        wall = time.perf_counter() - started
    _, status, usage = waited
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    maxrss = usage.ru_maxrss * 1024  # KiB on Linux; its waited-for children, our RSS at fork
    return {
        "exit_code": proc.returncode,
        "wall_s": round(wall, 3),
        "peak_rss_gb": round(max(peak, maxrss) / 1e9, 3),
        "peak_tree_rss_polled_gb": round(peak / 1e9, 3),
        "max_single_process_rss_gb": round(maxrss / 1e9, 3),
        "stdout": (work / "stdout").read_text(),
        "stderr_tail": (work / "stderr").read_text()[-2000:],  # warnings and errors
    }


def plan_run(spec: Path, extra: list[str], records: int, work: Path) -> dict:
    result = measure([*COMMAND, "jobs", "plan", str(spec), *extra, "--json"], work)
    stdout = result.pop("stdout")
    try:
        result["summary"] = json.loads(stdout)
    except json.JSONDecodeError:
        result["stdout_tail"] = stdout[-2000:]
    if result["exit_code"] != 0:
        return result
    per_min = records / result["wall_s"] * 60
    result["records_per_minute"] = round(per_min)
    result["goals_met"] = {
        "records_per_minute": per_min >= GOAL_RECORDS_PER_MIN,
        "peak_rss_gb": result["peak_rss_gb"] < GOAL_PEAK_GB,
    }
    return result


def measure_plans(spec: Path, records: int, work: Path) -> dict:
    figures = {"plan": plan_run(spec, [], records, work)}
    command = [*COMMAND, "jobs", "plan", "--help"]
    if "--write" not in subprocess.run(command, capture_output=True, text=True).stdout:
        figures["plan_write"] = {"skipped": "`nightshift jobs plan` has no --write flag yet"}
        return figures
    shutil.rmtree(work / "out", ignore_errors=True)
    figures["plan_write"] = plan_run(spec, ["--write"], records, work)
    written = [p.stat().st_size for p in (work / "out").rglob("*") if p.is_file()]
    figures["plan_write"].update(written_files=len(written), written_bytes=sum(written))
    return figures


def machine() -> dict:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "memory_total_gb": round(memory / 1e9, 1),
        "python": platform.python_version(),
        "rss_polled_with_psutil": psutil is not None,
    }


def shape_figures(args: argparse.Namespace, shape: str) -> dict:
    """Build (in a child process) or reuse the data of one shape, then time its plans."""
    # Build in a child: a child's ru_maxrss starts at its parent's peak RSS (the fork copies
    # the high-water mark), so this process stays small and the planner's figure clean.
    child = [sys.executable, __file__, *sys.argv[1:], "--generate-only", "--shape", shape]
    info = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
    print(json.dumps(info, indent=2))
    figures = dict(info)
    with tempfile.TemporaryDirectory(prefix="plan-scale-") as tmp:
        spec = write_spec(Path(info["data_dir"]), Path(tmp), shape)
        figures["spec"] = yaml.safe_load(spec.read_text())
        figures.update(measure_plans(spec, info["records"], Path(tmp)))
    if figures["plan"]["exit_code"]:
        raise SystemExit(f"nightshift jobs plan failed: {figures['plan']['stderr_tail']}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--shape", choices=["fields", "column", "both"], default="both")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/plan_scale.json")
    parser.add_argument("--cache", type=Path, default=ROOT / "benchmarks/.cache/plan_scale")
    parser.add_argument("--generate-only", action="store_true", help="Build the data, exit.")
    args = parser.parse_args()

    if args.generate_only:
        built = dataset(args.cache, args.records, args.files, args.shape)
        print(json.dumps(describe(*built, args.shape), indent=2))
        return
    if not (MODEL / "config.json").exists():
        subprocess.run([*COMMAND, "demo", "init"], cwd=ROOT, check=True)
    figures = {"benchmark": "nightshift jobs plan at scale", "machine": machine()}
    figures["goals"] = {"records_per_minute": GOAL_RECORDS_PER_MIN, "peak_rss_gb": GOAL_PEAK_GB}
    if args.shape in ("fields", "both"):
        figures.update(shape_figures(args, "fields"))
    if args.shape in ("column", "both"):
        figures["single_column"] = shape_figures(args, "column")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
