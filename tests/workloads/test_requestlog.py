"""The request-log importer and the chat-template rendering, on the tiny tokenizer (no Django)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from apps.workloads.chat_template import ChatRenderer, ChatTemplateError
from apps.workloads.corpus import CorpusError, corpus_dumps, corpus_loads, corpus_sha256
from apps.workloads.redaction import redactor
from apps.workloads.requestlog import parse_request_log, trace_from_request_log
from apps.workloads.tracefile import trace_dumps, trace_loads
from tests.workloads.conftest import REPO

EXAMPLE = REPO / "examples" / "traces" / "chat-log.jsonl"


@pytest.fixture(scope="module")
def renderer(tokenizer_dir: Path) -> ChatRenderer:
    return ChatRenderer(tokenizer_dir)


def _log(*lines: object) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def _chat(t: object, text: str, **body: object) -> dict[str, object]:
    return {
        "timestamp": t,
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": text}], "max_tokens": 8, **body},
    }


def test_it_renders_with_the_tokenizers_own_template(renderer: ChatRenderer, tokenizer_dir: Path) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = renderer.render(messages)
    assert text == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi there</s>\n<|assistant|>\n"
    ids = renderer.chat_ids(messages)
    # BOS and EOS come from the template as the special tokens, not their letters.
    assert ids[0] == 1 and ids.count(2) == 2
    assert renderer.count_chat(messages) == len(ids)
    assert len(renderer.template_sha256) == 64 and len(renderer.tokenizer_sha256) == 64
    # A completion's text is counted with BOS, as the server adds it to a text prompt.
    assert renderer.count_text("Hi there") == 1 + len(
        renderer._tok.encode("Hi there", add_special_tokens=False)
    )


def test_it_refuses_to_render_without_a_template(tokenizer_dir: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(tokenizer_dir, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    renderer = ChatRenderer(plain)
    assert renderer.template_sha256 == ""
    with pytest.raises(ChatTemplateError, match="no chat template"):
        renderer.count_chat([{"role": "user", "content": "hi"}])


def test_it_reads_arrivals_outputs_and_both_line_shapes() -> None:
    data = _log(
        _chat(100.5, "first", max_completion_tokens=5),
        {"timestamp": 101.0, "prompt": "a completion", "max_tokens": 7, "temperature": 0.2},
        {**_chat(100.7, "second"), "response": {"body": {"usage": {"completion_tokens": 11}}}},
    )
    log = parse_request_log(data, redact=redactor())
    assert [r.line for r in log.rows] == [1, 3, 2]  # sorted by time, stably
    assert [r.t_s for r in log.rows] == pytest.approx([0.0, 0.2, 0.5])
    assert [r.output_tokens for r in log.rows] == [5, 11, 7]  # the logged usage wins over max_tokens
    assert log.rows[2].prompt == "a completion" and log.rows[2].messages is None
    assert log.repairs == ["sorted requests by arrival time: 2 moved"]
    assert log.ignored_fields == ["temperature"]


def test_it_reads_iso_times_and_text_parts() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    data = _log(
        {
            "timestamp": "2026-01-01T00:00:00Z",
            "messages": [{"role": "user", "content": parts}],
            "max_tokens": 4,
        },
        {
            "timestamp": "2026-01-01T00:00:01.250+00:00",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4,
        },
    )
    log = parse_request_log(data, redact=redactor())
    assert [r.t_s for r in log.rows] == [0.0, 1.25]
    assert log.rows[0].messages == [{"role": "user", "content": "one\ntwo"}]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}, "line 2: timestamp is required"),
        (_chat(1.0, "x", tools=[{"type": "function"}]), "line 2: tools change what the template renders"),
        (_chat(1.0, "x", n=2), "line 2: n must be 1"),
        (
            {**_chat(1.0, "x"), "url": "/v1/completions"},
            "line 2: url '/v1/completions' does not match a chat",
        ),
        (_chat("2026-01-01T00:00:00Z", "x"), "line 2: timestamp is iso-zoned but the first line's is number"),
        (
            {"timestamp": 1.0, "messages": [{"role": "tool", "content": "x"}], "max_tokens": 3},
            "line 2: messages[0].role",
        ),
        (
            {
                "timestamp": 1.0,
                "messages": [{"role": "user", "content": [{"type": "image_url"}]}],
                "max_tokens": 3,
            },
            "line 2: messages[0].content[0]: only text parts",
        ),
        (
            {"timestamp": 1.0, "prompt": ["a", "b"], "max_tokens": 3},
            "line 2: prompt must be one non-empty text",
        ),
        ({"timestamp": 1.0, "messages": [{"role": "user", "content": "x"}]}, "line 2: no output length"),
        ("", "line 2: empty line inside the log"),
    ],
)
def test_it_names_the_line_of_the_first_problem(line: object, message: str) -> None:
    data = _log(_chat(0.5, "fine"), line, _chat(2.0, "fine too"))
    with pytest.raises(
        CorpusError, match=message.replace("(", r"\(").replace("[", r"\[").replace("]", r"\]")
    ):
        parse_request_log(data, redact=redactor())


def test_a_default_output_length_fills_lines_that_log_none() -> None:
    data = _log({"timestamp": 1.0, "messages": [{"role": "user", "content": "x"}]})
    assert parse_request_log(data, redact=redactor(), default_output_tokens=9).rows[0].output_tokens == 9


def test_it_redacts_while_parsing_so_no_original_text_is_returned(renderer: ChatRenderer) -> None:
    secret = "robin13@example.org"
    data = _log(
        _chat(0.0, f"write to {secret} about order 4411"),
        {"timestamp": 0.5, "prompt": f"Dear {secret},", "max_tokens": 4},
    )
    log = parse_request_log(data, redact=redactor(rules=["email", "number"]))
    trace, corpus = trace_from_request_log(
        log, renderer=renderer, thresholds=[("all", None)], tokenizer_revision="r", max_model_len=512
    )
    stored = corpus_dumps(corpus) + trace_dumps(trace)
    assert secret.encode() not in stored and b"4411" not in stored
    assert log.rows[0].messages == [{"role": "user", "content": "write to [EMAIL] about order [NUMBER]"}]
    assert trace.meta["redaction"]["replaced"] == {"email": 2, "number": 1}


def test_classes_come_from_the_rendered_counts(renderer: ChatRenderer) -> None:
    short = [{"role": "user", "content": "hi"}]
    long = [{"role": "system", "content": "lo mi ne " * 20}, {"role": "user", "content": "tu ra si " * 20}]
    bound = renderer.count_chat(short)
    data = _log(
        {"timestamp": 0.0, "messages": short, "max_tokens": 4},
        {"timestamp": 0.25, "messages": long, "max_tokens": 4},
        {"timestamp": 0.5, "prompt": "hi", "max_tokens": 4},
    )
    trace, corpus = trace_from_request_log(
        parse_request_log(data, redact=redactor()),
        renderer=renderer,
        thresholds=[("short", bound), ("long", None)],
        priorities={"long": 1},
        tokenizer_revision="rev",
        max_model_len=4096,
    )
    counts = [renderer.count_chat(short), renderer.count_chat(long), renderer.count_text("hi")]
    assert [r.input_tokens for r in trace.requests] == counts
    assert [r.klass for r in trace.requests] == ["short", "long", "short"]
    assert [r.priority for r in trace.requests] == [0, 1, 0]
    assert trace.requests[1].messages == long and trace.requests[2].prompt == "hi"
    assert trace.meta["class_input_tokens"]["long"] == {"requests": 1, "median": counts[1], "max": counts[1]}
    assert trace.meta["chat_template_sha256"] == renderer.template_sha256
    # The corpus is the prompts in trace order with their classes; the trace names it by hash.
    assert trace.meta["corpus_sha256"] == corpus_sha256(corpus_dumps(corpus))
    assert [e.klass for e in corpus.entries] == ["short", "long", "short"]
    assert corpus_loads(corpus_dumps(corpus)) == corpus
    assert trace_loads(trace_dumps(trace)) == trace


def test_it_drops_prompts_that_do_not_fit_and_caps_outputs(renderer: ChatRenderer) -> None:
    fits = [{"role": "user", "content": "hi"}]
    n = renderer.count_chat(fits)
    data = _log(
        {"timestamp": 0.0, "messages": fits, "max_tokens": 100},
        {"timestamp": 0.1, "messages": [{"role": "user", "content": "ka lo " * 200}], "max_tokens": 1},
    )
    trace, _ = trace_from_request_log(
        parse_request_log(data, redact=redactor()),
        renderer=renderer,
        thresholds=[("all", None)],
        tokenizer_revision="r",
        max_model_len=n + 10,
    )
    assert len(trace.requests) == 1 and trace.requests[0].output_tokens == 10
    assert trace.meta["too_long_dropped"] == 1 and trace.meta["capped_outputs"] == 1


def test_it_cuts_the_busiest_window_and_scales_time(renderer: ChatRenderer) -> None:
    data = _log(*[_chat(t, f"q{t}") for t in (0.0, 10.0, 10.5, 10.9, 11.2, 30.0)])
    trace, corpus = trace_from_request_log(
        parse_request_log(data, redact=redactor()),
        renderer=renderer,
        thresholds=[("all", None)],
        tokenizer_revision="r",
        max_model_len=512,
        busiest_s=1.0,
        speed=2.0,
    )
    assert [r.t_offset_s for r in trace.requests] == pytest.approx([0.0, 0.25, 0.45])
    assert trace.meta["window"] == {"start_s": 10.0, "length_s": 1.0}
    assert trace.meta["observation_s"] == 0.5 and len(corpus.entries) == 3


def test_the_shipped_example_log_imports(renderer: ChatRenderer) -> None:
    log = parse_request_log(EXAMPLE.read_bytes(), redact=redactor(rules=["email", "key", "number"]))
    trace, corpus = trace_from_request_log(
        log,
        renderer=renderer,
        thresholds=[("short", 100), ("long", None)],
        tokenizer_revision="r",
        max_model_len=4096,
    )
    assert len(trace.requests) == 32 == len(corpus.entries)
    assert {r.klass for r in trace.requests} == {"short", "long"}
    assert sum(r.messages is not None for r in trace.requests) == 28
    assert b"@example.org" not in corpus_dumps(corpus) and b"sk-demo" not in corpus_dumps(corpus)
