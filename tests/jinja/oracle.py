#!/usr/bin/env python3
"""Renders chat templates with Python's jinja2 the way Hugging Face
transformers' apply_chat_template does (an ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, a tojson that keeps
non-ASCII text and key order, raise_exception and strftime_now as globals,
{% generation %} blocks rendered as their content). test_jinja compares
PhaselLab's interpreter with this, case by case.

stdin: {"now": EPOCH_SECONDS, "cases": [{"template": SOURCE, "context": {...}}]}
stdout: [{"ok": true, "text": ...} | {"ok": false, "error": ...}, ...]
"""
import datetime
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    # {% generation %} ... {% endgeneration %}: transformers marks the
    # assistant's tokens with it; the text is the block's content.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def main():
    spec = json.load(sys.stdin)
    now = datetime.datetime.fromtimestamp(spec.get("now", 0))  # local time, as transformers' datetime.now()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    out = []
    for case in spec["cases"]:
        try:
            text = env.from_string(case["template"]).render(**case.get("context", {}))
            out.append({"ok": True, "text": text})
        except Exception as e:  # noqa: BLE001 - every failure is a result to compare
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
