"""Timed traces: reading (JSONL, relabelled fields, Azure CSV, bad rows), the send schedule,
and the hash-id token blocks (equal ids -> equal blocks; vLLM's lengths)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from framework.base.errors import ConfigError
from framework.config.trace_spec import TimedTraceSpec
from framework.load.prompts import load_tokenizer
from framework.load.trace import TraceRow
from framework.load.trace import mean_rate
from framework.load.trace import read_trace
from framework.load.trace import send_offsets
from framework.load.trace_prompts import BlockBuilder
from framework.load.trace_prompts import trace_requests
from framework.load.trace_prompts import vocabulary
from framework.load.workload import Dataset
from framework.tools.trace_samples import azure_csv
from framework.tools.trace_samples import csv_text
from framework.tools.trace_samples import jsonl_text
from framework.tools.trace_samples import mooncake_trace
from tests.paths import ROOT

MOONCAKE = ROOT / "datasets" / "mooncake_sample.jsonl"
AZURE = ROOT / "datasets" / "azure_sample.csv"
DEFAULT = TimedTraceSpec()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ROOT / "models" / "tiny-llama")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_rows_with_vllms_field_names(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 20, "output_length": 3, '
                 '"hash_ids": [7, 8]}\n\n{"timestamp": 2.5, "input_length": 5, '
                 '"output_length": 1.0, "extra": "kept out"}\n')
    assert read_trace(path, DEFAULT) == [TraceRow(1, 0.0, 20, 3, (7, 8)),
                                         TraceRow(3, 2.5, 5, 1, None)]  # blank line 2 skipped
    assert read_trace(path, DEFAULT, limit=1) == [TraceRow(1, 0.0, 20, 3, (7, 8))]


def test_relabelled_fields_and_milliseconds(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", '{"t_ms": 1500, "in": 40, "out": 9, "blocks": [1]}\n'
                 '{"t_ms": 250, "in": 41, "out": 8, "blocks": []}\n')
    settings = TimedTraceSpec(sec_multiplier=0.001, label_timestamp="t_ms", label_input_length="in",
                              label_output_length="out", label_hash_ids="blocks")
    rows = read_trace(path, settings)
    assert [(r.timestamp_s, r.input_length, r.output_length, r.hash_ids) for r in rows] == [
        (1.5, 40, 9, (1,)), (0.25, 41, 8, None)]  # an empty list is no hash ids


def test_azure_csv_date_times_are_seconds_since_the_first_row(tmp_path: Path) -> None:
    path = write(tmp_path, "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.0805900,1020,7\n"
                 "2023-11-16 18:16:46.6805900,12,300\n")
    rows = read_trace(path, DEFAULT)
    assert [r.line for r in rows] == [2, 3, 4]
    assert [r.timestamp_s for r in rows] == pytest.approx([0.0, 3.4, 60.0])
    assert [(r.input_length, r.output_length, r.hash_ids) for r in rows] == [
        (374, 44, None), (1020, 7, None), (12, 300, None)]
    halved = read_trace(path, TimedTraceSpec(sec_multiplier=0.5))
    assert [r.timestamp_s for r in halved] == pytest.approx([0.0, 1.7, 30.0])


def test_csv_numeric_times_and_relabelled_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "arrival,prompt,completion\n10,5,6\n12.5,7,8\n")
    settings = TimedTraceSpec(label_timestamp="arrival", label_input_length="prompt",
                              label_output_length="completion")
    assert [(r.timestamp_s, r.input_length, r.output_length) for r in
            read_trace(path, settings)] == [(10.0, 5, 6), (12.5, 7, 8)]


GOOD = '{"timestamp": 0, "input_length": 4, "output_length": 2}\n'


@pytest.mark.parametrize(("name", "text", "line", "key", "reason"), [
    ("t.jsonl", GOOD + "{oops\n", 2, "(row)", "not JSON"),
    ("t.jsonl", GOOD + "[1, 2]\n", 2, "(row)", "expected a JSON object"),
    ("t.jsonl", '{"timestamp": 0, "input_len": 4, "output_length": 2}\n', 1, "input_length",
     "no such field"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 0, "output_length": 2}\n', 1, "input_length",
     "whole number >= 1"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 4.5, "output_length": 2}\n', 1,
     "input_length", "whole number"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 4, "output_length": true}\n', 1,
     "output_length", "whole number"),
    ("t.jsonl", GOOD * 2 + '{"timestamp": "noon", "input_length": 4, "output_length": 2}\n', 3,
     "timestamp", "finite number"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1, "a"]}'
     "\n", 1, "hash_ids", "list of integers"),
    ("t.csv", "TIMESTAMP,ContextTokens\n1,2\n", 1, "GeneratedTokens", "no such column"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\nyesterday,2,3\n", 3, "TIMESTAMP",
     "date-time"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n2,-2,3\n", 3, "ContextTokens",
     "whole number"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,2,3\n4,2,3\n", 3,
     "TIMESTAMP", "mixes numbers and date-times"),
])
def test_bad_row_names_file_line_and_key(tmp_path: Path, name: str, text: str, line: int,
                                         key: str, reason: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as err:
        read_trace(path, DEFAULT)
    assert (err.value.file, err.value.key) == (f"{path}:{line}", key)
    assert reason in err.value.reason and "\n" not in str(err.value)


def test_missing_or_empty_trace(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        read_trace(tmp_path / "none.jsonl", DEFAULT)
    with pytest.raises(ConfigError, match="holds no request"):
        read_trace(write(tmp_path, "e.jsonl", "\n\n"), DEFAULT)
    assert read_trace(write(tmp_path, "e2.jsonl", "\n"), DEFAULT, limit=0) == []


def rows_at(*times: float) -> list[TraceRow]:
    return [TraceRow(i + 1, t, 1, 1) for i, t in enumerate(times)]


@pytest.mark.parametrize(("times", "speed_up", "expected"), [
    ((0.0, 1.0, 3.0), 1.0, [0.0, 1.0, 3.0]),
    ((0.0, 1.0, 3.0), 2.0, [0.0, 0.5, 1.5]),
    ((0.0, 1.0, 3.0), 0.5, [0.0, 2.0, 6.0]),
    ((5.0, 6.0), 1.0, [5.0, 6.0]),            # not shifted to 0, as vLLM reads it
    ((2.0, 1.0, 4.0), 1.0, [2.0, 2.0, 4.0]),  # file order: an earlier time goes right after
    ((-1.0, 0.5), 1.0, [0.0, 0.5]),           # a negative time goes at once
])
def test_send_offsets(times: tuple[float, ...], speed_up: float, expected: list[float]) -> None:
    assert send_offsets(rows_at(*times), speed_up) == pytest.approx(expected)


def test_schedule_scales_by_seconds_multiplier_and_speed_up(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", "".join(
        json.dumps({"timestamp": ms, "input_length": 3, "output_length": 1}) + "\n"
        for ms in (0, 400, 1000, 2600)))
    rows = read_trace(path, TimedTraceSpec(sec_multiplier=0.001))
    assert send_offsets(rows, 4.0) == pytest.approx([0.0, 0.1, 0.25, 0.65])
    with pytest.raises(ValueError, match="speed_up"):
        send_offsets(rows, 0.0)


def test_vocabulary_is_vllms_non_special_ids_sorted(tokenizer) -> None:
    vocab = vocabulary(tokenizer)
    assert vocab == sorted(set(range(4096)) - {0, 1, 2, 3})


@pytest.mark.parametrize(("hash_ids", "input_length", "chunk", "sizes"), [
    ([1, 2, 3], 48, 16, [16, 16, 16]),
    ([1, 2, 3], 40, 16, [16, 16, 8]),     # the last block is partial
    ([1, 2, 3], 32, 16, [16, 16]),        # stops once input_length is reached
    ([1, 2], 50, 16, [16, 16]),           # too few hash ids: shorter than input_length, as vLLM
    ([9], 5, 16, [5]),
    ([4, 5, 6, 7], 10, 3, [3, 3, 3, 1]),
])
def test_prompt_blocks_have_vllms_sizes(hash_ids: list[int], input_length: int, chunk: int,
                                        sizes: list[int]) -> None:
    builder = BlockBuilder(range(10, 500), chunk, salt=0)
    ids = builder.prompt(hash_ids, input_length)
    assert len(ids) == sum(sizes) == min(input_length, len(hash_ids) * chunk)
    start = 0
    for h, size in zip(hash_ids, sizes):
        assert ids[start:start + size] == builder.block(f"{h}:{size}")
        start += size


def test_equal_hash_ids_give_equal_blocks_and_distinct_ones_do_not(tokenizer) -> None:
    rows = [TraceRow(1, 0.0, 64, 4, (1, 2, 3, 4)), TraceRow(2, 0.1, 64, 4, (1, 2, 5, 6)),
            TraceRow(3, 0.2, 60, 4, (7, 2, 3, 4)), TraceRow(4, 0.3, 64, 4, (1, 2, 3, 4)),
            TraceRow(5, 0.4, 40, 4, None), TraceRow(6, 0.5, 40, 4, None)]
    reqs = trace_requests(tokenizer, rows, 16, salt=0)
    ids = [r.token_ids for r in reqs]
    assert [r.prompt_len for r in reqs] == [len(x) for x in ids] == [64, 64, 60, 64, 40, 40]
    assert [r.output_len for r in reqs] == [4] * 6
    assert ids[0] == ids[3]                                   # same ids, same prompt
    assert ids[0][:32] == ids[1][:32] and ids[0][32:48] != ids[1][32:48]
    assert ids[0][16:48] == ids[2][16:48] and ids[0][:16] != ids[2][:16]
    assert ids[0][48:] != ids[2][48:60]     # hash id 4 as a partial block (12) is its own block
    assert ids[4][:16] != ids[5][:16]       # rows without hash ids share nothing
    assert all(0 <= t < 4096 and t > 3 for x in ids for t in x)
    assert all(r.prompt == "" for r in reqs)


def test_salt_gives_fresh_tokens_with_the_same_reuse(tokenizer) -> None:
    rows = [TraceRow(1, 0.0, 32, 2, (1, 2)), TraceRow(2, 0.0, 32, 2, (1, 3))]
    a = [r.token_ids for r in trace_requests(tokenizer, rows, 16, salt=0)]
    b = [r.token_ids for r in trace_requests(tokenizer, rows, 16, salt=1)]
    assert a == [r.token_ids for r in trace_requests(tokenizer, rows, 16, salt=0)]
    assert a[0][:16] == a[1][:16] and b[0][:16] == b[1][:16] and a[0][:16] != b[0][:16]


def test_dataset_reads_a_trace_and_its_offsets(tokenizer) -> None:
    settings = TimedTraceSpec(sec_multiplier=0.001)
    dataset = Dataset("timed_trace", path=MOONCAKE, trace=settings)
    rows = read_trace(MOONCAKE, settings, 20)
    reqs = dataset.requests(tokenizer, 20, seed=3)
    assert reqs == trace_requests(tokenizer, rows, 16, 3)
    assert dataset.trace_offsets(20) == send_offsets(rows)
    assert Dataset("random").trace_offsets(20) is None
    with pytest.raises(ValueError, match="needs a path"):
        Dataset("timed_trace").requests(tokenizer, 2, 0)


def test_shipped_samples_are_the_generator_output() -> None:
    assert MOONCAKE.read_text() == jsonl_text(mooncake_trace(150, seed=0))
    assert AZURE.read_text() == csv_text(azure_csv(150, seed=0))
    assert MOONCAKE.stat().st_size < 40_000 and AZURE.stat().st_size < 10_000


def test_mooncake_sample_reuses_prefixes_and_fits_the_tiny_model() -> None:
    rows = read_trace(MOONCAKE, TimedTraceSpec(sec_multiplier=0.001))
    assert len(rows) == 150
    firsts = [r.hash_ids[:8] for r in rows if r.hash_ids]
    shared = sum(firsts.count(f) > 1 for f in firsts)
    assert shared > 50                      # most rows share their first 128 tokens with another
    assert all(r.hash_ids and len(r.hash_ids) == math.ceil(r.input_length / 16) for r in rows)
    assert max(r.input_length + r.output_length for r in rows) <= 1024
    assert 20 < send_offsets(rows)[-1] < 60
    azure = read_trace(AZURE, DEFAULT)
    assert len(azure) == 150 and all(r.hash_ids is None for r in azure)
    assert 20 < send_offsets(azure)[-1] < 60


VLLM_TIMED_TRACE = """
import json, sys
from vllm.benchmarks.datasets.datasets import TimedTrace

class Tok:  # what TimedTrace asks of a tokenizer, from the tiny model's tokenizer.json
    def __init__(self, path):
        from tokenizers import Tokenizer
        self.t = Tokenizer.from_file(path)
        self.all_special_ids = [i for i, a in self.t.get_added_tokens_decoder().items()
                                if a.special]
    def get_vocab(self):
        return self.t.get_vocab(with_added_tokens=True)

tok, results = Tok(sys.argv[1]), []
for path, chunk, mult, labels, n in json.loads(sys.argv[2]):
    kwargs = {f"timed_trace_label_{k}": v for k, v in labels.items()}
    trace = TimedTrace(dataset_path=path, timed_trace_chunk_hash_size=chunk,
                       timed_trace_sec_multiplier=mult, **kwargs)
    results.append([[s.prompt, s.expected_output_len, s.timestamp]
                    for s in trace.sample(tok, n)])
print("RESULT=" + json.dumps(results))
"""


def shared_blocks(prompts: list[tuple[int, ...]] | list[list[int]], chunk: int) -> list[int]:
    """Per prompt, the longest prefix it shares with any earlier prompt, in whole chunks (a
    token or two after a shared prefix can be equal by chance)."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            best = max(best, len(os.path.commonprefix([list(p), list(q)])))
        out.append(best // chunk)
    return out


def test_same_trace_same_lengths_times_and_reuse_as_vllms_timed_trace(tmp_path: Path,
                                                                      tokenizer) -> None:
    """vLLM's own TimedTrace (in a subprocess: importing vLLM takes ~10 s) on the Mooncake
    sample, and on a relabelled copy read with chunk 7 (rows with too few hash ids): the
    same prompt lengths, output lengths and timestamps, and the same prefix sharing."""
    import subprocess
    import sys

    relabelled = tmp_path / "relabelled.jsonl"
    relabelled.write_text("".join(
        json.dumps({"ts": r["timestamp"], "in": r["input_length"], "out": r["output_length"],
                    "ids": r["hash_ids"]}) + "\n" for r in mooncake_trace(60, seed=4)))
    labels = {"timestamp": "ts", "input_length": "in", "output_length": "out", "hash_ids": "ids"}
    defaults = {"timestamp": "timestamp", "input_length": "input_length",
                "output_length": "output_length", "hash_ids": "hash_ids"}
    cases = [(str(MOONCAKE), 16, 0.001, {}, 150), (str(relabelled), 7, 0.01, labels, 40)]
    done = subprocess.run(
        [sys.executable, "-c", VLLM_TIMED_TRACE,
         str(ROOT / "models" / "tiny-llama" / "tokenizer.json"),
         json.dumps([(p, c, m, {**defaults, **names}, n) for p, c, m, names, n in cases])],
        capture_output=True, text=True, timeout=120, check=True)
    results = json.loads(done.stdout.split("RESULT=", 1)[1])
    for (path, chunk, mult, names, n), theirs in zip(cases, results):
        settings = TimedTraceSpec(chunk_hash_size=chunk, sec_multiplier=mult,
                                  **{f"label_{k}": v for k, v in names.items()})
        rows = read_trace(Path(path), settings, n)
        ours = trace_requests(tokenizer, rows, chunk, salt=0)
        assert len(ours) == len(theirs) == n
        assert [r.prompt_len for r in ours] == [len(t[0]) for t in theirs]
        assert [r.output_len for r in ours] == [t[1] for t in theirs]
        assert [r.timestamp_s for r in rows] == pytest.approx([t[2] for t in theirs])
        reuse = shared_blocks([r.token_ids for r in ours], chunk)
        assert reuse == shared_blocks([t[0] for t in theirs], chunk)
        assert sum(b > 0 for b in reuse) > n // 4
        if chunk == 7:  # hash ids of 16-token blocks read as 7: prompts cut short, as in vLLM
            assert any(r.prompt_len < row.input_length for r, row in zip(ours, rows))


def test_bench_takes_vllms_timed_trace_flags_and_defaults() -> None:
    import argparse

    from framework.load.bench_args import add_cli_args

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(["--model", "m", "--dataset-name", "timed_trace"])
    assert (args.timed_trace_chunk_hash_size, args.timed_trace_sec_multiplier) == (16, 1.0)
    assert args.self_timed is None
    relabelled = parser.parse_args(["--model", "m", "--timed-trace-label-timestamp", "t",
                                    "--timed-trace-label-hash-ids", "ids", "--no-self-timed"])
    assert (relabelled.timed_trace_label_timestamp, relabelled.timed_trace_label_hash_ids,
            relabelled.self_timed) == ("t", "ids", False)


@pytest.mark.parametrize(("extra", "key"), [
    (["--dataset-path", "{bad}"], "{bad}:2: output_length"),
    (["--dataset-path", str(MOONCAKE), "--endpoint", "chat"], "--endpoint"),
    (["--dataset-path", str(MOONCAKE), "--timed-trace-chunk-hash-size", "0"],
     "--timed-trace-chunk-hash-size"),
    ([], "--dataset-path"),
])
def test_bench_refuses_a_bad_trace_in_one_line(tmp_path: Path, extra: list[str],
                                               key: str) -> None:
    from tests.cli import bench_cli

    bad = write(tmp_path, "bad.jsonl", GOOD + '{"timestamp": 1, "input_length": 3}\n')
    args = [a.replace("{bad}", str(bad)) for a in extra]
    res = bench_cli("--base-url", "http://127.0.0.1:9", "--model", str(ROOT / "models" /
                    "tiny-llama"), "--dataset-name", "timed_trace", *args)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and key.replace("{bad}", str(bad)) in res.stderr
    assert "Traceback" not in res.stderr


def test_bench_self_timed_only_with_a_trace() -> None:
    from tests.cli import bench_cli

    res = bench_cli("--base-url", "http://127.0.0.1:9", "--model",
                    str(ROOT / "models" / "tiny-llama"), "--self-timed")
    assert res.returncode == 2 and "--self-timed" in res.stderr


@pytest.mark.parametrize(("stamps", "rate"), [
    ([0.0, 1.0, 2.0, 4.0], 1.0),       # 4 requests over 4 s
    ([10.0, 10.5], 4.0),               # 2 over 0.5 s: not shifted to 0, the span counts
    ([3.0, 1.0, 2.0], 1.5),            # out of file order: latest 3 - earliest 1 = 2 s
])
def test_mean_rate_is_requests_over_the_span(stamps, rate):
    rows = [TraceRow(line=i + 1, timestamp_s=t, input_length=1, output_length=1)
            for i, t in enumerate(stamps)]
    assert mean_rate(rows) == pytest.approx(rate)


@pytest.mark.parametrize("stamps", [[], [5.0], [2.0, 2.0]])
def test_mean_rate_needs_a_span(stamps):
    rows = [TraceRow(line=1, timestamp_s=t, input_length=1, output_length=1) for t in stamps]
    with pytest.raises(ValueError, match="span 0 s"):
        mean_rate(rows)
