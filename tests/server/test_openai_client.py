"""phaselab-cli serve against the official OpenAI Python client and curl.

usage: test_openai_client.py PHASELAB_CLI MODEL.gguf   (tests/server/run.sh sets up the client)

The oracle of every greedy answer is `phaselab-cli generate --json` on the
same model and context: the server must give the same text, alone and with
eight streams at once.
"""
import json
import re
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

import openai
from openai import OpenAI

CLI, MODEL = sys.argv[1], sys.argv[2]
CTX = "512"


def start_server(*extra):
    """Starts `phaselab-cli serve --port 0`; returns (process, base_url)."""
    p = subprocess.Popen([CLI, "serve", "-m", MODEL, "--port", "0", "--ctx-size", CTX, "--parallel", "8", *extra],
                         stdout=subprocess.PIPE, text=True)
    url = p.stdout.readline().strip()
    if not url.startswith("http://"):
        p.kill()
        raise RuntimeError("serve printed no address (its error is above): " + url)
    return p, url


def stop_server(p):
    p.terminate()
    p.wait(timeout=30)
    p.stdout.close()


def generate(prompt, n, chat):
    """The solo answer of phaselab-cli generate (greedy)."""
    args = [CLI, "generate", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0", "--ctx-size", CTX, "--json", "-q"]
    if chat:
        args.append("--chat")
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["text"]


def curl(*args):
    r = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", *args], capture_output=True, text=True, check=True)
    body, _, code = r.stdout.rpartition("\n")
    return int(code), body


def metric(base, name):
    text = urllib.request.urlopen(base.rsplit("/v1", 1)[0] + "/metrics").read().decode()
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


class OpenAIClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, cls.url = start_server()
        cls.client = OpenAI(base_url=cls.url, api_key="unused", max_retries=0)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        stop_server(cls.proc)

    def test_models(self):
        ids = [m.id for m in self.client.models.list()]
        self.assertEqual(ids, ["stories260K"])

    def test_chat_greedy_equals_generate(self):
        want = generate("Tell me about a cat.", 40, chat=True)
        self.assertTrue(want)
        r = self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Tell me about a cat."}],
                                                temperature=0, max_tokens=40)
        self.assertEqual(r.choices[0].message.content, want)
        self.assertGreater(r.usage.completion_tokens, 0)
        self.assertGreater(r.model_extra["timings"]["ttft_ms"], 0)
        s = self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Tell me about a cat."}],
                                                temperature=0, max_tokens=40, stream=True,
                                                stream_options={"include_usage": True})
        chunks = list(s)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, want)
        self.assertEqual(chunks[-1].usage.completion_tokens, r.usage.completion_tokens)
        self.assertIn(chunks[-2].choices[0].finish_reason, ("stop", "length"))

    def test_completions_equal_generate(self):
        want = generate("Once upon a time", 30, chat=False)
        r = self.client.completions.create(model=self.model, prompt="Once upon a time", temperature=0, max_tokens=30)
        self.assertEqual(r.choices[0].text, want)
        s = self.client.completions.create(model=self.model, prompt="Once upon a time", temperature=0, max_tokens=30,
                                           stream=True)
        self.assertEqual("".join(c.choices[0].text for c in s if c.choices), want)

    def test_eight_concurrent_streams_equal_solo(self):
        prompts = [f"Story {i}: a {['dog', 'boat', 'bird', 'tree'][i % 4]} went out." for i in range(8)]
        want = [generate(p, 24 + 4 * i, chat=True) for i, p in enumerate(prompts)]
        got = [None] * 8
        passes0 = metric(self.url, "phaselab_forward_passes_total")
        tokens0 = metric(self.url, "phaselab_generation_tokens_total")
        barrier = threading.Barrier(8)

        def run(i):
            c = OpenAI(base_url=self.url, api_key="unused", max_retries=0)
            barrier.wait()
            s = c.chat.completions.create(model=self.model, messages=[{"role": "user", "content": prompts[i]}],
                                          temperature=0, max_tokens=24 + 4 * i, stream=True)
            got[i] = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(8):
            self.assertEqual(got[i], want[i], f"stream {i}")
        passes = metric(self.url, "phaselab_forward_passes_total") - passes0
        tokens = metric(self.url, "phaselab_generation_tokens_total") - tokens0
        self.assertLess(passes, tokens, "the streams should share forward passes")

    def test_disconnect_frees_blocks(self):
        cancelled0 = metric(self.url, 'phaselab_requests_total{finish="cancelled"}')
        s = self.client.completions.create(model=self.model, prompt="Once upon a time", temperature=0.9, seed=3,
                                           max_tokens=400, stream=True)
        for i, _ in enumerate(s):
            if i == 2:
                break
        s.close()  # the client goes away mid-stream
        deadline = time.time() + 10
        while time.time() < deadline and metric(self.url, 'phaselab_requests_total{finish="cancelled"}') == cancelled0:
            time.sleep(0.05)
        self.assertEqual(metric(self.url, 'phaselab_requests_total{finish="cancelled"}'), cancelled0 + 1)
        self.assertEqual(metric(self.url, "phaselab_kv_blocks_used"), 0)
        self.assertEqual(metric(self.url, "phaselab_requests_running"), 0)

    def test_bad_fields_are_400_naming_them(self):
        for kwargs, param in [({"temperature": 5}, "temperature"), ({"n": 17}, "n"), ({"max_tokens": 0}, "max_tokens"),
                              ({"top_p": 1.5}, "top_p"), ({"stop": 3}, "stop")]:
            with self.assertRaises(openai.BadRequestError) as e:
                self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "hi"}], **kwargs)
            self.assertEqual(e.exception.body["param"], param)
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model=self.model, messages=[{"role": "tool", "content": "x"}])

    def test_cli_remote_equals_local(self):
        want = generate("Once upon a time", 20, chat=False)
        r = subprocess.run([CLI, "generate", "--remote", self.url, "-p", "Once upon a time", "-n", "20", "--temp", "0",
                            "--json", "-q"], capture_output=True, text=True, check=True)
        j = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(j["text"], want)
        self.assertEqual(j["model"], "stories260K")
        self.assertGreater(j["ttft_ms"], 0)
        bad = subprocess.run([CLI, "generate", "--remote", self.url, "--remote-model", "nope", "-p", "x"],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("stories260K", bad.stderr)

    def test_curl(self):
        code, body = curl(self.url + "/models")
        self.assertEqual(code, 200)
        self.assertEqual(json.loads(body)["data"][0]["id"], "stories260K")
        code, body = curl("-N", self.url + "/completions", "-H", "Content-Type: application/json",
                          "-d", '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": true}')
        self.assertEqual(code, 200)
        self.assertTrue(body.rstrip().endswith("data: [DONE]"), body)
        code, body = curl(self.url + "/chat/completions", "-H", "Content-Type: application/json", "-d", '{"messages": 7}')
        self.assertEqual(code, 400)
        self.assertEqual(json.loads(body)["error"]["param"], "messages")
        # DNS rebinding: a Host that is not this server's.
        code, body = curl(self.url + "/models", "-H", "Host: evil.example")
        self.assertEqual(code, 403)
        # A browser page of another origin.
        code, body = curl(self.url + "/models", "-H", "Origin: http://evil.example")
        self.assertEqual(code, 403)
        self.assertIn("--cors", body)


class ServeOptionsTest(unittest.TestCase):
    def test_non_loopback_without_key_is_refused(self):
        r = subprocess.run([CLI, "serve", "-m", MODEL, "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--api-key", r.stderr)

    def test_api_key(self):
        p, url = start_server("--api-key", "s3cret")
        try:
            with self.assertRaises(openai.AuthenticationError):
                OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
            c = OpenAI(base_url=url, api_key="s3cret", max_retries=0)
            r = c.completions.create(model="stories260K", prompt="Once", max_tokens=3, temperature=0)
            self.assertTrue(r.choices[0].text)
        finally:
            stop_server(p)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
