from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kpo.data.math import load_problems

SHARED = Path(
    os.environ.get("KPO_SHARED_DATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
)
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared benchmark data not found at {SHARED}")


@needs_shared
@pytest.mark.filterwarnings("ignore:.*collapsed.*:UserWarning")
@pytest.mark.filterwarnings("ignore:.*restored LaTeX.*:UserWarning")
@pytest.mark.parametrize(
    "name, rows, first_id, first_answer",
    [
        ("aime24.jsonl", 30, "60", "204"),
        ("aime25.jsonl", 30, "0", "70"),  # int answers
        ("aime25.fixed.jsonl", 30, "0", "70"),
        ("amc23.jsonl", 40, "0", "27"),  # 27.0 -> "27"
        ("math500.jsonl", 500, "test/precalculus/807.json", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("minerva.jsonl", 272, "0", "1.6"),  # from the solution's last \boxed{}
        ("minerva.deepscaler.json", 272, "9", "9.6"),
        ("olympiadbench.jsonl", 675, "1606", "2"),
        ("gsm8k.jsonl", 1319, "0", "18"),
        ("dapo_math_17k.head256.jsonl", 256, "0", "34"),
        ("dapo_math_17k.parquet", 17917, "0", "34"),
        ("aime24.dapo_x32.parquet", 30, "2", "540"),  # 960 rows = 30 problems x 32 copies, collapsed
    ],
)
def test_every_shared_file_loads(name, rows, first_id, first_answer):
    out = load_problems(SHARED / name)
    assert len(out) == rows
    assert out[0]["id"] == first_id and out[0]["answer"] == first_answer
    assert len({r["id"] for r in out}) == rows
    assert all(set(r) == {"id", "problem", "answer"} and r["problem"].strip() for r in out)


@needs_shared
def test_shared_quirks():
    # AIME25: "\frac" and "\triangle" were written unescaped (form feed / tab); the loader restores them,
    # matching the hand-fixed copy exactly.
    with pytest.warns(UserWarning, match=r"row 18, row 19, row 27"):
        broken = load_problems(SHARED / "aime25.jsonl")
    assert broken == load_problems(SHARED / "aime25.fixed.jsonl")
    # A real tab in prose stays a tab (MATH500 row 426 "have\tequal\tperimeters").
    math500 = load_problems(SHARED / "math500.jsonl")
    assert "have\tequal\tperimeters" in math500[426]["problem"]
    # OlympiadBench multi-answers "$69$,$84$"-style lists are joined without the dollars.
    olympiad = {r["id"]: r for r in load_problems(SHARED / "olympiadbench.jsonl")}
    assert any(r["answer"] == "69,84" for r in olympiad.values())
    # GSM8K drops thousands separators: "#### 2,125" -> "2125".
    assert "2125" in {r["answer"] for r in load_problems(SHARED / "gsm8k.jsonl")}
    # Deepscaler Minerva keeps distinct alternatives as a list; same problems as the Qwen copy.
    deep = {r["id"]: r for r in load_problems(SHARED / "minerva.deepscaler.json")}
    qwen = {r["id"]: r for r in load_problems(SHARED / "minerva.jsonl")}
    assert deep.keys() == qwen.keys()
    assert any(isinstance(r["answer"], list) and len(r["answer"]) == 2 for r in deep.values())
    # Minerva 72's box holds a stray "$ $" (math inside math): dropped, so the answer parses whole.
    assert qwen["72"]["answer"] == "x_{0} \\cos (\\omega t)+ \\dot{x}_{0} \\sin (\\omega t) / \\omega"
    # DAPO's AIME parquet: the raw problem, not the "Solve the following..." instruction wrapper.
    with pytest.warns(UserWarning, match="collapsed 930 exact duplicate rows"):
        dapo = load_problems(SHARED / "aime24.dapo_x32.parquet")
    assert not any(r["problem"].startswith("Solve the following") for r in dapo)


def _jsonl(tmp_path: Path, rows: list, name: str = "bench.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"problem": "p", "answer": "1"}, "{not json"], r"bench.jsonl: row 1 \(line 2\): invalid JSON"),
        ([{"problem": "p", "answer": "1"}, {"problem": "q"}], r"row 1 \(line 2\): missing field 'answer'"),
        (
            [{"problem": "p", "answer": "1"}, {"problem": "q", "answer": " "}],
            r"row 1 .*field 'answer' is empty",
        ),
        (
            [{"problem": "p", "answer": "1"}, {"problem": "q", "answer": {"x": 1}}],
            r"row 1 .*must be a string",
        ),
        ([{"problem": "p", "answer": "1"}, [1, 2]], r"row 1 .*expected a JSON object"),
        # a NaN answer would read as the text "nan" and grade every response 0
        (
            [{"problem": "p", "answer": 1.0}, {"problem": "q", "answer": float("nan")}],
            r"row 1 .*must be finite",
        ),
        ([{"question": "q", "final_answer": "2"}], r"row 0 .*'final_answer' must be a non-empty list"),
        ([{"problem": "p", "solution": "so it is 5"}], r"row 0 .*no complete \\boxed"),
        ([{"question": "q", "answer": "#### 1\n#### 2"}], r"row 0 .*exactly one '#### N'"),
        ([{"text": "q", "label": "1"}], r"row 0 .*cannot detect the format.*problem_key"),
        (
            [{"id": 1, "problem": "p", "answer": "1"}, {"id": 1, "problem": "q", "answer": "2"}],
            r"id '1' already",
        ),
    ],
)
def test_bad_rows_name_file_and_row(tmp_path, rows, match):
    with pytest.raises(ValueError, match=match):
        load_problems(_jsonl(tmp_path, rows))


def test_explicit_keys_and_misc(tmp_path):
    path = _jsonl(tmp_path, [{"q": "2+2?", "a": 4}, {"q": "3+3?", "a": "6"}])
    assert load_problems(path, problem_key="q", answer_key="a") == [
        {"id": "0", "problem": "2+2?", "answer": "4"},
        {"id": "1", "problem": "3+3?", "answer": "6"},
    ]
    with pytest.raises(ValueError, match="give both problem_key and answer_key"):
        load_problems(path, problem_key="q")
    with pytest.raises(ValueError, match=r"row 1 .*missing field 'a'"):
        load_problems(
            _jsonl(tmp_path, [{"q": "x", "a": 1}, {"q": "y"}], "k.jsonl"), problem_key="q", answer_key="a"
        )
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_problems(tmp_path / "missing.jsonl")
    # Exact duplicates collapse with a warning; blank lines are not rows.
    dup = _jsonl(
        tmp_path, [{"id": 7, "problem": "p", "answer": "1"}, "", {"id": 7, "problem": "p", "answer": "1"}]
    )
    with pytest.warns(UserWarning, match="collapsed 1 exact duplicate"):
        assert load_problems(dup) == [{"id": "7", "problem": "p", "answer": "1"}]


def test_a_dollar_inside_a_boxed_answer_is_dropped_but_an_escaped_one_stays(tmp_path):
    rows = [
        {"problem": "p", "solution": "so $\\boxed{a+$ $b}$"},
        {"problem": "q", "solution": "costs \\boxed{\\$5}"},
    ]
    assert [r["answer"] for r in load_problems(_jsonl(tmp_path, rows))] == ["a+ b", "\\$5"]


def test_verl_parquet_and_json_list(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "What is $1+1$?"},
            ],
            "reward_model": {"ground_truth": "2", "style": "rule"},
            "extra_info": {"index": 5},
        },
        {
            "prompt": [{"role": "user", "content": "What is $2+2$?"}],
            "reward_model": {"ground_truth": "4", "style": "rule"},
            "extra_info": {"index": 6},
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    assert load_problems(tmp_path / "train.parquet") == [
        {"id": "5", "problem": "What is $1+1$?", "answer": "2"},
        {"id": "6", "problem": "What is $2+2$?", "answer": "4"},
    ]
    bad = [rows[0], {**rows[1], "reward_model": None}]
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad.parquet: row 1: field 'reward_model' must be a dict"):
        load_problems(tmp_path / "bad.parquet")
    # A .json file holds a list of row objects.
    (tmp_path / "d.json").write_text(json.dumps([{"problem": "p", "answer": ["1", "1.0\n", "1"]}]))
    assert load_problems(tmp_path / "d.json") == [{"id": "0", "problem": "p", "answer": ["1", "1.0"]}]
    (tmp_path / "e.json").write_text(json.dumps({"problem": "p"}))
    with pytest.raises(ValueError, match="e.json: expected a JSON list"):
        load_problems(tmp_path / "e.json")


def test_swallowed_latex_escapes_are_restored_and_real_tabs_kept(tmp_path):
    # Written by a tool that forgot to escape backslashes: "\frac", "\beta", "\times" became control chars.
    path = tmp_path / "raw.jsonl"
    path.write_text(
        '{"problem": "Find \\frac{1}{2} \\beta and 3 \\times 4;\\ttab\\tequal", "answer": "\\frac12"}\n'
    )
    with pytest.warns(UserWarning, match="restored LaTeX backslashes .* in row 0"):
        (row,) = load_problems(path)
    assert row["problem"] == "Find \\frac{1}{2} \\beta and 3 \\times 4;\ttab\tequal"
    assert row["answer"] == "\\frac12"


def test_format_prompt_puts_the_instruction_on_its_own_line():
    from kpo.data.math import DEFAULT_INSTRUCTION, format_prompt

    assert format_prompt("What is 1+1?") == "What is 1+1?\n" + DEFAULT_INSTRUCTION
    assert format_prompt("What is 1+1?", "Answer in \\boxed{}.") == "What is 1+1?\nAnswer in \\boxed{}."
    assert format_prompt("What is 1+1?", "") == "What is 1+1?"
    assert format_prompt("What is 1+1?", "Answer in \\boxed{}.\n") == "What is 1+1?\nAnswer in \\boxed{}."
