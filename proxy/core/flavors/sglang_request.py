"""SGLang 0.5.23's chat request model, as far as it shapes the prompt: which messages, parts and tools its
pydantic models accept, and the dicts their `model_dump()` hands to the chat template. Pure.

Each rule cites `sglang/srt/entrypoints/openai/protocol.py` (class names) or
`sglang/srt/function_call/utils.py`. A request the models reject is answered 400 (http_server.py
`validation_exception_handler`); here that is `InvalidBody` with a reason that quotes nothing of the request.
"""

from __future__ import annotations

from typing import Any

from .. import messages
from ..messages import ServerRefuses

REFUSES = "sglang answers 400: "
# _GenericMessageRole, matched case-insensitively (`_normalize_role`); "user" is the user message model.
GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
MEDIA_PARTS = {"image_url": "image", "video_url": "video", "audio_url": "audio", "input_audio": "audio"}
_PHASES = (None, "commentary", "final_answer")


def refuse(why: str) -> ServerRefuses:
    return ServerRefuses(REFUSES + why)


def lax_bool(value: Any, name: str) -> bool:
    return messages.lax_bool(value, name, REFUSES)


def lax_int(value: Any, name: str) -> int:
    return messages.lax_int(value, name, REFUSES)


def lax_float(value: Any, name: str) -> None:
    messages.lax_float(value, name, REFUSES)


def optional_str(value: Any, name: str) -> Any:
    if value is not None and not isinstance(value, str):
        raise refuse(f"{name} is not a string")
    return value


_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")


def effort(value: Any) -> Any:
    """ReasoningEffortType: a tier name, or a number (a numeric string too) in [0, 0.99]."""
    if value is None or value in _EFFORTS:
        return value
    try:
        number = (
            float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else -1.0
        )
    except ValueError:
        number = -1.0
    if not 0.0 <= number <= 0.99:
        raise refuse("reasoning_effort invalid")
    return number


def message_role(msg: Any) -> str:
    """ChatCompletionMessageParam: "user" exactly, or one of the generic roles in any case (lower-cased)."""
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise refuse("message without a string role")
    role: str = msg["role"]
    if role == "user":
        return role
    if role.lower() not in GENERIC_ROLES:
        raise refuse("message role is not one SGLang accepts")
    return role.lower()


def content_part(part: Any, role: str) -> dict[str, Any]:
    """ChatCompletionMessageContentPart, dumped. Media parts are checked by the caller (text-only model)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise refuse("text part without a string text")
        return {"type": "text", "text": part["text"]}
    if kind in ("thinking", "reasoning"):
        # ChatCompletionMessageContentThinkingPart: exactly one of thinking/text; assistant messages only.
        values = [part.get("thinking"), part.get("text")]
        if sum(isinstance(v, str) for v in values) != 1 or any(
            v is not None and not isinstance(v, str) for v in values
        ):
            raise refuse("thinking part without exactly one text")
        if role != "assistant":
            raise refuse("thinking part outside an assistant message")
        return {"type": kind, "thinking": values[0], "text": values[1]}
    if kind == "tool_reference":
        if not isinstance(part.get("name"), str):
            raise refuse("tool_reference part without a name")
        return {"type": kind, "name": part["name"]}
    if kind in MEDIA_PARTS:
        return {"type": kind}
    raise refuse("content part of a type SGLang does not accept")


def tool_call(call: Any) -> dict[str, Any]:
    """ToolCall / FunctionResponse, dumped in field order (`index` and unset fields present as null)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        raise refuse("tool call without a function object")
    if call.get("type", "function") != "function" or not isinstance(call.get("index", 0), (int, type(None))):
        raise refuse("tool call type or index invalid")
    args = fn.get("arguments")
    if args is not None and not isinstance(args, (str, dict)):
        raise refuse("tool call arguments neither a string nor an object")
    function = {"name": optional_str(fn.get("name"), "function name"), "arguments": args}
    call_id = optional_str(call.get("id"), "tool call id")
    return {"id": call_id, "index": call.get("index"), "type": "function", "function": function}


def tool(raw: Any) -> dict[str, Any]:
    """Tool / Function, dumped as `Tool.model_dump()`: the function's keys in the order the client sent them
    (`Function._capture_key_order`), `description`/`parameters` null when absent, `strict`/`defer_loading`
    only when set; and the Tool's own `defer_loading`, null unless set: every tool reaches the template with
    one more field than the client sent (`, "defer_loading": null` in a `tojson` dump)."""
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise refuse("tool without a function name")
    if not isinstance(raw.get("type", "function"), str):
        raise refuse("tool type is not a string")
    optional_str(fn.get("description"), "tool description")
    flags = {k: None if fn.get(k) is None else lax_bool(fn[k], k) for k in ("strict", "defer_loading")}
    defer = None if raw.get("defer_loading") is None else lax_bool(raw["defer_loading"], "defer_loading")
    if defer is not None and flags["defer_loading"] is None:
        flags["defer_loading"] = defer  # Tool._propagate_defer_loading
    fields = {
        "description": fn.get("description"),
        "name": fn["name"],
        "parameters": fn.get("parameters"),
        **flags,
    }
    fields = {k: v for k, v in fields.items() if v is not None or k in ("description", "parameters")}
    order = [k for k in fn if k in fields] + [k for k in fields if k not in fn]  # Function._serialize
    return {
        "type": raw.get("type", "function"),
        "function": {k: fields[k] for k in order},
        "defer_loading": defer,
    }


# function_call/utils.py normalize_json_schema_types: DB/ORM type names in tool `parameters` are rewritten
# (in place, before the dump, so the model sees the rewrite) by these tables, then the schema is checked
# against JSON Schema 2020-12 (`Draft202012Validator.check_schema`: a failure is a 400).
STANDARD_TYPES = {"null", "boolean", "object", "array", "number", "string", "integer"}
TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum", "uuid", "date", "datetime", "time"), "string"),
    **dict.fromkeys(("timestamp", "binary", "blob", "bytea", "bytes", "varbinary"), "string"),
    "bool": "boolean",
    **dict.fromkeys(("bigint", "smallint", "tinyint"), "integer"),
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    **dict.fromkeys(("arr", "tuple", "set"), "array"),
    "map": "object",
}
_PREFIX_RULES = (
    (("int", "uint", "long", "short", "unsigned"), "integer"),
    (("num", "float"), "number"),
    (("list",), "array"),
    (("dict",), "object"),
)
_BOUNDARY = frozenset("0123456789[<( \t")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedItems", "unevaluatedProperties")  # fmt: skip


def _single_type(raw: Any) -> Any:
    if not isinstance(raw, str) or raw in STANDARD_TYPES:
        return raw
    base = raw.split("(", 1)[0].strip().lower()
    if base in STANDARD_TYPES:
        return base
    if base in TYPE_ALIASES:
        return TYPE_ALIASES[base]
    for prefixes, target in _PREFIX_RULES:
        if any(
            base == p or (base.startswith(p) and len(base) > len(p) and base[len(p)] in _BOUNDARY)
            for p in prefixes
        ):
            return target
    return raw


def schema(value: Any) -> Any:
    """A copy of a tool's `parameters` with its types rewritten; refused where the rewritten `type` values
    (or a subschema that is neither an object nor a boolean) fail the metaschema. Other keywords are not
    checked against the metaschema."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, dict):
        raise refuse("tool parameters are not a JSON Schema")
    out = dict(value)
    if "type" in out:
        t = out["type"]
        if isinstance(t, list):
            t = list(dict.fromkeys(_single_type(x) for x in t))
            if not t or not all(x in STANDARD_TYPES for x in t):
                raise refuse("tool parameters have an invalid type")
        elif _single_type(t) not in STANDARD_TYPES:
            raise refuse("tool parameters have an invalid type")
        out["type"] = t if isinstance(t, list) else _single_type(t)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: schema(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [schema(v) for v in out[key]]
    for key in _SCHEMA_ONE:
        if key in out:
            out[key] = [schema(v) for v in out[key]] if isinstance(out[key], list) else schema(out[key])
    return out


def message_fields(msg: dict[str, Any]) -> dict[str, Any]:
    """ChatCompletionMessageGenericParam's fields besides role and content, type-checked, in field order."""
    calls = msg.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise refuse("tool_calls is not a list")
    tools = msg.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise refuse("message tools is not a list")
    if msg.get("phase") not in _PHASES:
        raise refuse("message phase invalid")
    return {
        "tool_call_id": optional_str(msg.get("tool_call_id"), "tool_call_id"),
        "name": optional_str(msg.get("name"), "name"),
        "phase": msg.get("phase"),
        "reasoning_content": optional_str(msg.get("reasoning_content"), "reasoning_content"),
        "tool_calls": None if calls is None else [tool_call(c) for c in calls],
        "tools": None if tools is None else [tool(t) for t in tools],
        "prefix": None if msg.get("prefix") is None else lax_bool(msg["prefix"], "prefix"),
    }
