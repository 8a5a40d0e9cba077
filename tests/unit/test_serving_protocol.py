"""protocol.parse: every malformed body is a RequestError (4xx) whose message names the field, repeats a short
form of the value and says what is allowed; nothing else ever escapes (an escaping exception is a 500)."""

from __future__ import annotations

import json

import pytest

from toolkit.deploy.serving.protocol import (MAX_BODY_BYTES, MAX_NEW_TOKENS, MAX_PROMPT_BYTES, MAX_TEXT_BYTES,
                                      ClassifyRequest, GenerateRequest, RequestError, ScoreRequest, body_too_large,
                                      parse)

HUGE = "9" * 5000  # past Python's 4,300-digit int conversion limit


def refusal(body: bytes | str) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse(body.encode() if isinstance(body, str) else body)
    assert 400 <= caught.value.status < 500
    assert len(str(caught.value)) < 300, "a message repeats a short form of the value, never all of it"
    return caught.value


@pytest.mark.parametrize("body, field, words", [
    ("[" * 30000 + "]" * 30000, "body", "nested too deeply"),
    ('{"prompt": ' + "[" * 30000 + "]" * 30000 + "}", "body", "nested too deeply"),
    ('{"prompt": "\\ud800"}', "prompt", "lone surrogate"),
    ('{"task": "score", "text": "ok \\udfff"}', "text", "at character 3 is a lone surrogate"),
    ('{"task": ["score"], "text": "x"}', "task", "a JSON array of 1 item is not allowed"),
    ('{"task": {"score": 1}}', "task", "a JSON object of 1 item is not allowed"),
    ('{"task": 1}', "task", "1 is not allowed"),
    ('{"task": null}', "task", "None is not allowed"),
    (f'{{"prompt": "x", "seed": {HUGE}}}', "seed", "a 5,000-digit number is not allowed"),
    (f'{{"prompt": "x", "seed": -{HUGE}}}', "seed", "a 5,000-digit number is not allowed"),
    (f'{{"prompt": "x", "max_new_tokens": {HUGE}}}', "max_new_tokens", "5,000-digit"),
    (f'{{"prompt": "x", "temperature": {HUGE}}}', "temperature", "5,000-digit"),
    (f'{{"prompt": "x", "{"z" * 5000}": 1}}', "zzzz", "unknown field"),
    ('{"prompt": "x", "prompt": "y"}', "prompt", "given twice"),
    ('{"prompt": "x", "temperature": NaN}', "temperature", "nan is not allowed"),
    ('{"prompt": "x", "top_k": 1e400}', "top_k", "inf is not allowed"),
    ('{"prompt": "' + "x" * 5000 + '", "beam": 2}', "beam", "unknown field"),
    ("null", "body", "a JSON null"),
    ('"text"', "body", "a JSON string"),
    ("", "body", "not valid JSON"),
])
def test_the_inputs_that_escaped_as_500_are_refused_naming_the_field(body, field, words):
    error = refusal(body)
    assert str(error).startswith(f"{field}"), error
    assert words in str(error), error


def test_only_utf8_json_is_accepted():
    assert refusal('{"prompt": "x"}'.encode("utf-16")).args[0].startswith("body: not UTF-8")
    assert refusal(b"\xef\xbb\xbf" + b'{"prompt": "x"}').args[0].startswith("body: not valid JSON")


def bad_values(kind: str, low: int = 0, high: int = 0) -> list:
    """JSON texts that are not a valid value of ``kind``: wrong types, boundaries, odd numbers and text."""
    wrong_type = ["true", "false", "[]", "{}", '[1]', '{"a": 1}', '"1"', "[[[[[[[[]]]]]]]]"]
    if kind == "int":
        return wrong_type + ["null", str(low - 1), str(high + 1), "1.5", "1.0", "-0.5", "1e3", str(2**63),
                             str(-2**63 - 1), HUGE, "NaN", "Infinity", "-Infinity", '"\\ud800"']
    if kind == "number":
        return wrong_type + ["null", "-0.001", "5.0001", "1e309", "-1e309", "NaN", "Infinity", HUGE]
    return ["null", "0", "1.5", "-1", "true", "[]", "{}", '["x"]', '""', '"\\ud800"', '"a\\udc00b"',
            '"\\udc00\\ud800"', json.dumps("x" * (high + 1)), json.dumps("é" * (high // 2 + 1)), HUGE]


FIELDS = [  # (task, field, kind, low, high, the other fields a valid request needs)
    ("generate", "prompt", "text", 1, MAX_PROMPT_BYTES, {}),
    ("generate", "max_new_tokens", "int", 1, MAX_NEW_TOKENS, {"prompt": "x"}),
    ("generate", "top_k", "int", 0, 256, {"prompt": "x"}),
    ("generate", "seed", "int", 0, 2**63 - 1, {"prompt": "x"}),
    ("generate", "temperature", "number", 0, 5, {"prompt": "x"}),
    ("score", "text", "text", 1, MAX_TEXT_BYTES, {"task": "score"}),
]
CASES = [(task, field, value, rest) for task, field, kind, low, high, rest in FIELDS
         for value in bad_values(kind, low, high) if not (field == "seed" and value == "null")]


@pytest.mark.parametrize("task, field, value, rest", CASES, ids=[f"{c[1]}={c[2][:20]}" for c in CASES])
def test_every_wrong_value_of_every_field_is_refused_naming_it(task, field, value, rest):
    body = json.dumps(rest)[:-1] + (", " if rest else "") + f'"{field}": {value}}}'
    if len(body.encode()) > MAX_BODY_BYTES:
        pytest.skip("over the body limit: refused as a whole")
    error = refusal(body)
    assert str(error).startswith(f"{field}: "), error
    assert "allowed:" in str(error), error


def test_an_oversized_body_is_413_and_good_bodies_still_parse():
    assert refusal(b" " * (MAX_BODY_BYTES + 1)).status == 413
    assert parse(b'{"prompt": "\\ud83d\\ude00", "seed": 0}') == GenerateRequest("😀".encode(), 64, 1.0, 0, 0)
    assert parse(b'{"task": "score", "text": "x"}') == ScoreRequest(b"x")
    assert parse(b'{"prompt": "x", "temperature": 0, "seed": null, "top_k": 256}').top_k == 256


def test_each_limit_itself_is_accepted():
    # the refusals above start one past each limit; the limit must still be a valid request
    limits = parse(json.dumps({"prompt": "é" * (MAX_PROMPT_BYTES // 2), "max_new_tokens": MAX_NEW_TOKENS,
                               "temperature": 5, "top_k": 0, "seed": 2**63 - 1}).encode())
    assert limits == GenerateRequest("é".encode() * (MAX_PROMPT_BYTES // 2), MAX_NEW_TOKENS, 5.0, 0, 2**63 - 1)
    assert type(limits.temperature) is float
    assert parse(json.dumps({"prompt": "x", "max_new_tokens": 1}).encode()).max_new_tokens == 1
    assert parse(json.dumps({"task": "score", "text": "x" * MAX_TEXT_BYTES}).encode()).text == b"x" * MAX_TEXT_BYTES
    body = b'{"prompt": "x"' + b" " * (MAX_BODY_BYTES - 15) + b"}"
    assert len(body) == MAX_BODY_BYTES and parse(body).prompt == b"x"


@pytest.mark.parametrize("body, message", [
    ('{"prompt": "x", "max_new_tokens": 513}', "max_new_tokens: 513 is not allowed; allowed: an integer from 1 to 512"),
    ('{"prompt": "x", "top_k": -1}', "top_k: -1 is not allowed; allowed: an integer from 0 to 256"),
    ('{"prompt": "x", "temperature": "hot"}',
     "temperature: 'hot' is not allowed; allowed: a number from 0 (greedy) to 5"),
    ('{"prompt": ""}', "prompt: empty; allowed: a string of 1 to 4,096 UTF-8 bytes"),
    ('{"prompt": "' + "é" * 2049 + '"}',
     "prompt: 4,098 bytes is over the limit; allowed: a string of 1 to 4,096 UTF-8 bytes"),
    ('{"prompt": "x", "top_k": "' + "y" * 5000 + '"}',
     "top_k: '" + "y" * 39 + "… (5,000 characters) is not allowed"),
    ('{"task": "translate", "text": "x"}', "task: 'translate' is not allowed; allowed: generate, score"),
    ('{"task": "score", "text": "x", "prompt": "y"}', "prompt: unknown field for task 'score'; allowed: task, text"),
    ('{"text": "x"}', "text: unknown field for task 'generate'; allowed: max_new_tokens, prompt, seed, task, "
                      "temperature, top_k"),
    ('{"max_new_tokens": 8}', "prompt: None is not allowed; allowed: a string of 1 to 4,096 UTF-8 bytes"),
    ('{"task": "score"}', "text: None is not allowed; allowed: a string of 1 to 16,384 UTF-8 bytes"),
    ("{}", "prompt: None is not allowed"),
    ("[]", "body: a JSON array; allowed: a JSON object"),
    ("true", "body: a JSON boolean; allowed"),
    ("4.5", "body: a JSON number; allowed"),
    ('{"prompt": "x",\n "seed": }', "body: not valid JSON (Expecting value at line 2 column 10); allowed: a JSON "
                                   "object"),
    ('{"prompt": "x"} {}', "body: not valid JSON (Extra data at line 1 column 17)"),
    ('{"a": [], "a": 1}', "a: given twice; allowed: each field once"),
])
def test_a_refusal_says_exactly_what_was_wrong(body, message):
    assert message in str(refusal(body)), str(refusal(body))


def test_a_missing_field_takes_its_default_and_an_explicit_default_is_the_same():
    defaults = parse(b'{"prompt": "x"}')
    assert defaults == GenerateRequest(b"x", 64, 1.0, 0, None)
    assert parse(b'{"task": "generate", "prompt": "x", "max_new_tokens": 64, "temperature": 1.0, "top_k": 0, '
                 b'"seed": null}') == defaults
    assert parse(b' \n\t{"prompt": "x"}\r\n ') == defaults, "whitespace around the object is JSON"


@pytest.mark.parametrize("size, message", [
    (MAX_BODY_BYTES + 1, f"body: {MAX_BODY_BYTES + 1:,} bytes is over the limit; allowed: up to {MAX_BODY_BYTES:,}"),
    ("70000", "body: 70,000 bytes is over the limit"),
    ("9" * 41, "body: a 41-digit number is over the limit"),
])
def test_an_oversized_body_is_one_413_whoever_notices_it(size, message):
    error = body_too_large(size)
    assert error.status == 413 and str(error).startswith(message), str(error)


CLASSIFY = ("classify",)  # what a sequence classifier's endpoint answers (toolkit.deploy.serving.options.served_tasks)


def test_a_classifier_takes_classify_requests_and_refuses_the_language_model_tasks():
    assert parse(b'{"task": "classify", "text": "what a day"}', CLASSIFY) == ClassifyRequest(b"what a day")
    assert parse(b'{"text": "what a day"}', CLASSIFY) == ClassifyRequest(b"what a day"), "its first task is the default"
    with pytest.raises(RequestError, match=r"^task: 'generate' is not allowed; allowed: classify$"):
        parse(b'{"task": "generate", "prompt": "x"}', CLASSIFY)
    with pytest.raises(RequestError, match=r"^prompt: unknown field for task 'classify'; allowed: task, text$"):
        parse(b'{"prompt": "x"}', CLASSIFY)
    with pytest.raises(RequestError, match=r"^text: None is not allowed; allowed: a string of 1 to 16,384 UTF-8"):
        parse(b'{"task": "classify"}', CLASSIFY)
    with pytest.raises(RequestError, match=r"^text: empty; allowed"):
        parse(b'{"text": ""}', CLASSIFY)


def test_a_language_model_refuses_classify():
    with pytest.raises(RequestError, match=r"^task: 'classify' is not allowed; allowed: generate, score$"):
        parse(b'{"task": "classify", "text": "x"}')
