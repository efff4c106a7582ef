#!/usr/bin/env python3
"""Hostile clients against `phaselab-cli serve` (the OpenAI-compatible server).

usage: hostile_clients.py PHASELAB_CLI MODEL.gguf [--json OUT] [--list] [CASE ...]
       (HOSTILE_JSON=OUT in the environment does the same as --json OUT)

Runs every case (or only those named), prints one line per case,
`PASS name` or `FAIL name: reason`, then exactly `N passed, M failed`, and
exits 1 when any case failed (2 on a usage error). --json OUT writes
{case: "pass" | "fail: reason"} for a before/after table. Diagnostics (case
times, servers' peak RSS) go to stderr. Standard library only; every client
talks raw HTTP over sockets to 127.0.0.1, so that requests no library would
send can be sent; every connect, read and loop is bounded (no socket wait
over 10 s, no case over 60 s); the whole suite takes well under 3 minutes
even when everything fails. Servers are killed when the script exits.

The cases check the behaviour the server should have, so a server with the
old shortcomings fails many of them. Servers (each `serve -m MODEL --port 0
-t 1`, started on first use, restarted if one dies, which fails the case that
killed it):
  main   --parallel 4                      most cases
  body   --parallel 2 --max-body 65536     body framing and size limits, RSS
  key    --parallel 2 --api-key KEY        authorization
  slow   --parallel 4                      slow and idle connections (fresh)
  crowd  --parallel 4                      200 simultaneous clients (fresh)
  term   --parallel 1                      SIGTERM cases (a fresh one each)

What each group expects:
 host_*     Host is an exact allow-list: 127.0.0.1, 127.x.y.z, localhost,
            [::1], each with or without :PORT -> 200 on /v1/models and
            /metrics (both show the model's path); look-alikes
            (127.0.0.1.evil.com, 127.0.0.1.nip.io, 127.0.0.1evil,
            localhost.evil.com, evil.com) -> 403 without the path in the
            body; userinfo/port junk (127.0.0.1:80@evil.com, 127.0.0.1:abc)
            and an empty Host value -> 403 (400 accepted: RFC 9112 calls an
            invalid Host a 400); HTTP/1.1 without Host or with two Host
            headers (even equal ones) -> 400.
 chunked_*  Chunked bodies are held to --max-body: 1 MB chunked -> 413 fast,
            a 512 MB chunked stream (we send at most 64 MB / 2 s) -> 413,
            one chunk declared as 1 GiB -> 413 without waiting for it; RSS
            (VmRSS) grows by a few MB at most; a bad chunk-size line -> 400;
            a small valid chunked body still works (200).
 cl_*, te_* Content-Length huge -> 413/400 within 1 s; negative, "12abc",
            two different values, or together with Transfer-Encoding -> 400;
            an unknown/non-final transfer coding -> 400/501.
 slow_*     64 body-dribbling + 200 idle connections must not starve the
            server: /health answers within 1 s (5 probes) and a small
            completion succeeds; a header dribbled at 1 byte/s is cut (close
            or 408) within 20 s.
 crowd_*    200 simultaneous clients (half /health, half max_tokens 4): each
            gets a status, 200 or 503 with Retry-After; no reset, no empty
            reply, no timeout.
 pipeline_* Requests written back to back on one connection are answered in
            order (a POST among them included).
 sigterm_*  SIGTERM with 8 long greedy requests on --parallel 1: a request
            that did not really finish gets an error status (503), an error
            event or a closed connection, never 200 with partial text or a
            stream with a normal finish_reason; the server exits within 15 s.
 field_*    response_format and unknown fields -> 400 naming them;
            max_tokens 9223372036854775808 -> 400 quoting that number (not a
            wrapped negative); out-of-range numbers -> 400; logit_bias
            works; n=2 gives two choices (also streamed); chat logprobs with
            top_logprobs 3 and completions logprobs 2 in OpenAI's shapes.
 auth_*     With --api-key: a NUL-suffixed key -> 401 (400 accepted),
            duplicate Authorization headers -> 400/401, the right key -> 200.
 cancel_*   A non-streamed request whose client goes away is cancelled
            (phaselab_requests_total{finish="cancelled"} +1 within 2 s,
            requests_running back to 0), as a streamed one already is.
 others     100 KB header line, 1000 headers, 100 KB URL -> 431/414/400
            fast; garbage request lines -> 400; HTTP/0.9 -> 400 or close;
            absurd methods -> 400/405/501; non-UTF-8 and 100000-deep JSON
            -> 400 (no crash); prompts over the context -> 400
            context_length_exceeded fast; a client closing mid-body; a
            half-closed client still gets its answer; 20 requests on one
            keep-alive connection; query strings; traversal paths -> 404;
            Expect: 100-continue; and finally every server is alive and
            answers /health (peak RSS reported on stderr).

A request that needs a long generation uses the greedy answer of the same
request as its reference (so the text of a really finished request is
known) and adds "ignore_eos": true when the server accepts that field.
field_logit_bias_forces_token biases token ids 300 and 400 by +100 (in
stories260K "▁ha" and "▁do"; any vocabulary of more than 400 merged
pieces works) and wants each forced 3 times (" ha ha ha"). If every SIGTERM
request finished before the signal, stderr says the case was inconclusive.
"""
import atexit
import json
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KEY = "hostile-key-7f3a"
PROMPT = "Once upon a time"
CASE_LIMIT_S = 60.0
CLI = MODEL = None


class CaseFail(Exception):
    pass


class Closed(Exception):
    """The connection ended before a complete response head."""


class Timeout(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise CaseFail(msg)


def short(b, n=160):
    if isinstance(b, bytes):
        b = b.decode("utf-8", "replace")
    b = b.replace("\r", "\\r").replace("\n", "\\n")
    return b if len(b) <= n else b[:n] + "..."


# ---------------------------------------------------------------- raw HTTP


class Resp:
    def __init__(self, status, reason, headers):
        self.status, self.reason, self.headers = status, reason, headers
        self.body = b""
        self.complete = False
        self.interim = []

    def header(self, name):
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            raise CaseFail(f"status {self.status}: body is not JSON: {short(self.body)}")

    def err_text(self):
        """The error object's message and param (or the raw body)."""
        try:
            e = json.loads(self.body)["error"]
            return f"{e.get('message')} [param={e.get('param')}, code={e.get('code')}]"
        except Exception:
            return short(self.body, 300)

    def __repr__(self):
        return f"{self.status} {short(self.body)}"


class Conn:
    def __init__(self, port, timeout=5.0):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=min(timeout, 10.0))
        self.buf = b""
        self.eof = False
        self.reset = False

    def send(self, data):
        self.sock.settimeout(10.0)
        self.sock.sendall(data)

    def try_send(self, data, timeout=10.0):
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def send_watching(self, data, piece=65536):
        """Sends data in pieces, stopping early when an answer arrives (a server that refuses a large
        request and closes must not lose its answer to the reset that unread data would cause)."""
        for i in range(0, len(data), piece):
            if i and self.readable(0):
                return False
            if not self.try_send(data[i:i + piece]):
                return False
        return True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def readable(self, wait=0.0):
        try:
            r, _, _ = select.select([self.sock], [], [], wait)
            return bool(r)
        except (OSError, ValueError):
            return True

    def fill(self, deadline):
        """Reads more into buf; False at the end of the stream. Timeout past the deadline."""
        while True:
            if self.eof:
                return False
            rem = deadline - time.monotonic()
            if rem <= 0:
                raise Timeout("no answer in time")
            self.sock.settimeout(min(rem, 10.0))
            try:
                d = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                self.reset = self.eof = True
                return False
            except OSError:
                self.eof = True
                return False
            if not d:
                self.eof = True
                return False
            self.buf += d
            return True

    def until(self, deadline, pred):
        while not pred():
            if not self.fill(deadline):
                return pred()
        return True

    def read_response(self, timeout=5.0, method="GET"):
        deadline = time.monotonic() + timeout
        interim = []
        while True:
            if not self.until(deadline, lambda: b"\r\n\r\n" in self.buf):
                how = "reset" if self.reset else "closed"
                raise Closed(f"connection {how} with no complete response ({len(self.buf)} bytes: {short(self.buf, 60)})")
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            m = re.match(rb"HTTP/(\d\.\d) (\d{3})(?: (.*))?$", lines[0])
            if not m:
                raise CaseFail(f"bad status line from the server: {short(lines[0])}")
            status = int(m.group(2))
            headers = []
            for line in lines[1:]:
                k, _, v = line.partition(b":")
                headers.append((k.strip().lower().decode("latin-1"), v.strip().decode("latin-1")))
            if 100 <= status < 200:
                interim.append(status)
                continue
            break
        r = Resp(status, m.group(3).decode("latin-1") if m.group(3) else "", headers)
        r.interim = interim
        if method == "HEAD" or status in (204, 304):
            r.complete = True
            return r
        te = (r.header("transfer-encoding") or "").lower()
        cl = r.header("content-length")
        if "chunked" in te:
            body = b""
            while True:
                if not self.until(deadline, lambda: b"\r\n" in self.buf):
                    break
                line, _, self.buf = self.buf.partition(b"\r\n")
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise CaseFail(f"the server sent a bad chunk-size line: {short(line)}")
                if size == 0:
                    while self.until(deadline, lambda: b"\r\n" in self.buf):
                        t, _, self.buf = self.buf.partition(b"\r\n")
                        if t == b"":
                            r.complete = True
                            break
                    break
                if not self.until(deadline, lambda: len(self.buf) >= size + 2):
                    body += self.buf[:size]
                    self.buf = b""
                    break
                body += self.buf[:size]
                self.buf = self.buf[size + 2:]
            r.body = body
        elif cl is not None:
            n = int(cl)
            self.until(deadline, lambda: len(self.buf) >= n)
            r.body, self.buf = self.buf[:n], self.buf[n:]
            r.complete = len(r.body) == n
        else:
            while self.fill(deadline):
                pass
            r.body, self.buf = self.buf, b""
            r.complete = True
        return r


def build(port, method, path, body=None, headers=(), host=True, version="HTTP/1.1", close=True, ctype=True):
    """A request's bytes. headers: (name, value) pairs, str (latin-1) or bytes."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    out = [f"{method} {path} {version}".encode("latin-1")]
    if host is True:
        out.append(f"Host: 127.0.0.1:{port}".encode())
    elif host is not None:
        out.append(b"Host: " + (host if isinstance(host, bytes) else host.encode("latin-1")))
    names = set()
    for k, v in headers:
        k = k if isinstance(k, bytes) else k.encode("latin-1")
        v = v if isinstance(v, bytes) else v.encode("latin-1")
        names.add(k.lower())
        out.append(k + b": " + v)
    if body is not None:
        if ctype and b"content-type" not in names:
            out.append(b"Content-Type: application/json")
        if b"content-length" not in names and b"transfer-encoding" not in names:
            out.append(b"Content-Length: " + str(len(body)).encode())
    if close and b"connection" not in names:
        out.append(b"Connection: close")
    return b"\r\n".join(out) + b"\r\n\r\n" + (body or b"")


def request(port, method, path, body=None, headers=(), timeout=5.0, **kw):
    c = Conn(port, timeout)
    try:
        c.send_watching(build(port, method, path, body, headers, **kw))
        return c.read_response(timeout, method)
    finally:
        c.close()


def raw(port, data, timeout=5.0, shut_wr=False):
    c = Conn(port, timeout)
    try:
        c.send_watching(data)
        if shut_wr:
            try:
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        return c.read_response(timeout)
    finally:
        c.close()


def answer(port, data, timeout=3.0):
    """raw() that turns no-answer into a status: 'closed', 'reset' or 'timeout'."""
    try:
        return raw(port, data, timeout)
    except Closed as e:
        return "reset" if "reset" in str(e) else "closed"
    except Timeout:
        return "timeout"


def status_of(a):
    return a.status if isinstance(a, Resp) else a


def completion(port, body, timeout=10.0, path="/v1/completions", headers=()):
    return request(port, "POST", path, body, headers, timeout)


def metrics(port):
    r = request(port, "GET", "/metrics", timeout=5)
    check(r.status == 200, f"/metrics -> {r}")
    out = {}
    for line in r.body.decode("utf-8", "replace").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, val = line.rpartition(" ")
        try:
            out[name] = float(val)
        except ValueError:
            pass
    return out


def sse_data(body):
    return [line[5:].strip() for line in body.decode("utf-8", "replace").split("\n") if line.startswith("data:")]


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    r = fn(*a, **kw)
    return r, time.monotonic() - t0


# ---------------------------------------------------------------- servers

ALL_PROCS = []
SERVER_ARGS = {
    "main": ["--parallel", "4"],
    "body": ["--parallel", "2", "--max-body", "65536"],
    "key": ["--parallel", "2", "--api-key", KEY],
    "slow": ["--parallel", "4"],
    "crowd": ["--parallel", "4"],
    "term": ["--parallel", "1"],
}
SERVERS = {}


class Server:
    def __init__(self, kind):
        self.kind = kind
        self.args = SERVER_ARGS[kind]
        self.proc = None
        self.port = None
        self._long = None
        self._ctx = None
        self.base_rss_kb = 0

    def start(self):
        self.err = tempfile.TemporaryFile()
        env = {k: v for k, v in os.environ.items() if k != "PHASELAB_API_KEY"}
        self.proc = subprocess.Popen([CLI, "serve", "-m", MODEL, "--port", "0", "-t", "1", *self.args],
                                     stdout=subprocess.PIPE, stderr=self.err, stdin=subprocess.DEVNULL, env=env)
        ALL_PROCS.append(self.proc)
        line = b""
        deadline = time.monotonic() + 60
        fd = self.proc.stdout.fileno()
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 1.0)
            if r:
                d = os.read(fd, 4096)
                if not d:
                    break
                line += d
        m = re.match(rb"http://(.+):(\d+)/v1", line)
        if not m:
            self.kill()
            raise RuntimeError(f"{self.kind} server printed no address: {short(line)}; stderr: {self.stderr_tail()}")
        self.port = int(m.group(2))
        deadline = time.monotonic() + 15
        while True:
            try:
                if request(self.port, "GET", "/health", timeout=2).status == 200:
                    self.base_rss_kb = self.rss_kb() or 0  # the model's own needs, loaded and idle
                    return self
            except (OSError, Closed, Timeout, CaseFail):
                pass
            if time.monotonic() > deadline or not self.alive():
                self.kill()
                raise RuntimeError(f"{self.kind} server never answered /health; stderr: {self.stderr_tail()}")
            time.sleep(0.1)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def proc_kb(self, field):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1])
        except OSError:
            pass
        return None

    def instrumented(self):
        """Built with AddressSanitizer (scripts/test-sanitizers.sh)."""
        try:
            with open(f"/proc/{self.proc.pid}/maps") as f:
                return "libasan" in f.read()
        except OSError:
            return False

    def rss_kb(self):
        return self.proc_kb("VmRSS")

    def stderr_tail(self, n=300):
        try:
            self.err.seek(0, 2)
            size = self.err.tell()
            self.err.seek(max(0, size - n))
            return short(self.err.read(), n)
        except Exception:
            return "?"

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def ctx(self):
        if self._ctx is None:
            r = request(self.port, "GET", "/v1/models", timeout=5)
            check(r.status == 200, f"/v1/models -> {r}")
            self._ctx = int(r.json()["data"][0].get("meta", {}).get("n_ctx", 512))
        return self._ctx

    def long_fields(self):
        """{"ignore_eos": true} when the server takes that field, else {}."""
        if self._long is None:
            r = completion(self.port, {"prompt": PROMPT, "max_tokens": 1, "ignore_eos": True})
            self._long = {"ignore_eos": True} if r.status == 200 else {}
        return dict(self._long)


START_FAILED = {}


def get_server(kind):
    """The running server of that kind (a fresh one for "term"); a kind that failed to start once is not
    tried again (its cases fail at once instead of waiting for it each time)."""
    if kind in START_FAILED:
        raise RuntimeError(START_FAILED[kind] + " (earlier attempt)")
    s = SERVERS.get(kind)
    if kind == "term" or s is None or not s.alive():
        if s is not None:
            s.kill()
        try:
            s = Server(kind).start()
        except Exception as e:
            START_FAILED[kind] = f"{type(e).__name__}: {e}"
            raise
        SERVERS[kind] = s
    return s


def kill_all():
    for p in ALL_PROCS:
        try:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        except Exception:
            pass


# ---------------------------------------------------------------- cases

CASES = []


def case(kind="main"):
    def deco(fn):
        CASES.append((fn.__name__, kind, fn))
        return fn
    return deco


def expect(a, want, what):
    s = status_of(a)
    check(s in want, f"{what}: want {sorted(want)}, got {a!r}")


# --- 1. Host allow-list

ALLOWED_HOSTS = ["127.0.0.1", "127.0.0.1:{p}", "localhost", "localhost:{p}", "127.1.2.3", "[::1]", "[::1]:{p}"]


def host_matrix(srv, hosts, want):
    bad = []
    leak = os.path.basename(MODEL).encode()
    for h in hosts:
        hv = h.format(p=srv.port)
        for path in ("/v1/models", "/metrics"):
            a = answer(srv.port, build(srv.port, "GET", path, host=hv))
            if status_of(a) not in want:
                bad.append(f"Host {hv!r} {path} -> {status_of(a)}")
            elif 200 not in want and isinstance(a, Resp) and leak in a.body:
                bad.append(f"Host {hv!r} {path}: refused but the body names the model file")
    check(not bad, "; ".join(bad))


@case()
def host_loopback_forms_allowed(srv):
    host_matrix(srv, ALLOWED_HOSTS, {200})


@case()
def host_suffix_lookalikes_403(srv):
    host_matrix(srv, ["127.0.0.1.evil.com", "127.0.0.1.nip.io", "127.0.0.1evil", "localhost.evil.com"], {403})


@case()
def host_userinfo_port_junk_refused(srv):
    host_matrix(srv, ["127.0.0.1:80@evil.com", "127.0.0.1:abc", "localhost:80@evil.com"], {403, 400})


@case()
def host_foreign_403(srv):
    host_matrix(srv, ["evil.com", "evil.com:{p}"], {403})


@case()
def host_empty_value_refused(srv):
    host_matrix(srv, [""], {403, 400})


@case()
def host_missing_http11_400(srv):
    for path in ("/v1/models", "/metrics"):
        expect(answer(srv.port, build(srv.port, "GET", path, host=None)), {400}, f"no Host, GET {path}")


@case()
def host_duplicate_400(srv):
    p = srv.port
    for pair in [(f"127.0.0.1:{p}", "evil.com"), ("evil.com", f"127.0.0.1:{p}"), (f"127.0.0.1:{p}", f"127.0.0.1:{p}")]:
        a = answer(p, build(p, "GET", "/v1/models", host=None, headers=[("Host", pair[0]), ("Host", pair[1])]))
        expect(a, {400}, f"Host headers {pair}")


@case()
def origin_foreign_403(srv):
    a = answer(srv.port, build(srv.port, "GET", "/v1/models", headers=[("Origin", "http://evil.example")]))
    expect(a, {403}, "Origin http://evil.example")


# --- 2. chunked bodies and --max-body


def chunk(data):
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def chunked_head(port, path="/v1/completions"):
    return build(port, "POST", path, headers=[("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")],
                 close=True)


def stream_chunks(srv, total, piece, max_s, max_bytes=64 << 20):
    """Sends a chunked body of `total` bytes (at most max_bytes, for at most max_s seconds) while watching
    for an early answer and sampling the server's VmRSS. Returns (answer or reason string, bytes sent,
    seconds, the largest VmRSS seen in kB)."""
    c = Conn(srv.port, 10)
    t0 = time.monotonic()
    sent = 0
    note = ""
    peak = srv.rss_kb() or 0
    try:
        c.send(chunked_head(srv.port))
        first = b'{"prompt": "x", "max_tokens": 1}'
        data = first + b" " * (piece - len(first))
        while sent < total:
            peak = max(peak, srv.rss_kb() or 0)
            if c.readable(0.001):
                break
            if time.monotonic() - t0 > max_s or sent >= max_bytes:
                note = f"(stopped sending after {time.monotonic() - t0:.1f} s, {sent >> 20} MB)"
                break
            if not c.try_send(chunk(data), timeout=2.0):
                note = "(the server stopped reading)"
                break
            sent += len(data)
            data = b" " * piece
        else:
            c.try_send(b"0\r\n\r\n")
        try:
            a = c.read_response(4.0, "POST")
        except Closed as e:
            a = f"no answer: {e} {note}"
        except Timeout:
            a = f"no answer in 4 s after sending {note}"
        peak = max(peak, srv.rss_kb() or 0)
        return a, sent, time.monotonic() - t0, peak
    finally:
        c.close()


@case("body")
def chunked_small_ok(srv):
    c = Conn(srv.port, 10)
    try:
        c.send(chunked_head(srv.port) + chunk(b'{"prompt": "Once upon') + chunk(b' a time", "max_tok') +
               chunk(b'ens": 2, "temperature": 0}') + b"0\r\n\r\n")
        r = c.read_response(10, "POST")
    finally:
        c.close()
    check(r.status == 200, f"a valid 3-chunk body -> {r!r}")
    check(r.json()["choices"][0]["text"], "empty completion text")


@case("body")
def chunked_1mb_413(srv):
    rss0 = srv.rss_kb()
    a, sent, dt, peak = stream_chunks(srv, 1 << 20, 16384, 5.0)
    grow = (peak - rss0) / 1024 if rss0 and peak else 0
    check(isinstance(a, Resp) and a.status == 413, f"1 MB chunked (limit 64 KiB): {a!r} after {sent} bytes")
    check(dt < 3.0, f"413 took {dt:.2f} s")
    check(grow < 8, f"RSS grew {grow:.1f} MB")


@case("body")
def chunked_512mb_stream_413(srv):
    rss0 = srv.rss_kb()
    a, sent, dt, peak = stream_chunks(srv, 512 << 20, 256 << 10, 2.0)
    grow = (peak - rss0) / 1024 if rss0 and peak else 0
    check(isinstance(a, Resp) and a.status == 413,
          f"512 MB chunked stream: {a!r} after {sent >> 20} MB sent, RSS +{grow:.0f} MB")
    check(grow < 16, f"RSS grew {grow:.1f} MB while {sent >> 20} MB were sent")


@case("body")
def chunked_huge_declared_chunk_413(srv):
    c = Conn(srv.port, 5)
    try:
        c.send(chunked_head(srv.port) + b"40000000\r\n" + b" " * 1000)
        try:
            r = c.read_response(3.0, "POST")
        except Timeout:
            raise CaseFail("a chunk declared as 1 GiB (limit 64 KiB): no answer in 3 s (it waits for the data)")
    finally:
        c.close()
    check(r.status == 413, f"a chunk declared as 1 GiB -> {r!r}")


@case("body")
def chunked_bad_size_line_400(srv):
    bad = []
    data = b'{"prompt":"x","max_tokens":1}'  # 0x1d bytes: a parser that takes a bad size line answers 200
    for line in [b"zz", b"-1d", b"0x1d", b"+1d", b"1dz", b"1d zz", b"ffffffffffffffffffffffff", b""]:
        a = answer(srv.port, chunked_head(srv.port) + line + b"\r\n" + data + b"\r\n0\r\n\r\n")
        want = {400, 413} if line.startswith(b"fff") else {400}
        if status_of(a) not in want:
            bad.append(f"size line {line!r} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


def refused_fast(srv, content_length, want, what):
    """A request whose Content-Length alone is refused: answered within 1 s, before any body byte."""
    t0 = time.monotonic()
    a = answer(srv.port, build(srv.port, "POST", "/v1/completions", b"{}", headers=[("Content-Length", content_length)]),
               2.0)
    dt = time.monotonic() - t0
    expect(a, want, what)
    check(dt < 1.0, f"took {dt:.2f} s")


@case("body")
def cl_huge_413_fast(srv):
    refused_fast(srv, "99999999999999999999999", {413, 400}, "Content-Length 99999999999999999999999")


@case("body")
def cl_over_limit_413_fast(srv):
    refused_fast(srv, "1000000", {413}, "Content-Length 1000000 over --max-body 65536 (body not sent)")


@case("body")
def cl_negative_400(srv):
    refused_fast(srv, "-5", {400}, "Content-Length -5")


@case("body")
def cl_garbage_400(srv):
    bad = []
    for v in ["12abc", "0x10", "1 2", "+12", ""]:
        a = answer(srv.port, build(srv.port, "POST", "/v1/completions", b'{"prompt":"x"}', headers=[("Content-Length", v)]), 2.0)
        if status_of(a) != 400:
            bad.append(f"Content-Length {v!r} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case("body")
def cl_and_chunked_400(srv):
    body = b'{"prompt": "Once", "max_tokens": 1}'
    for hs in ([("Content-Length", str(len(body))), ("Transfer-Encoding", "chunked")],
               [("Transfer-Encoding", "chunked"), ("Content-Length", str(len(body)))]):
        a = answer(srv.port, build(srv.port, "POST", "/v1/completions", headers=hs) + chunk(body) + b"0\r\n\r\n")
        expect(a, {400}, f"both {hs[0][0]} and {hs[1][0]}")


@case("body")
def cl_duplicate_different_400(srv):
    body = b'{"prompt": "Once", "max_tokens": 1}'
    a = answer(srv.port, build(srv.port, "POST", "/v1/completions", body,
                               headers=[("Content-Length", str(len(body))), ("Content-Length", str(len(body) + 1))]))
    expect(a, {400}, "two different Content-Length headers")


@case("body")
def te_not_chunked_400(srv):
    body = b'{"prompt": "Once", "max_tokens": 1}'
    bad = []
    for te in ["xchunked", "chunked, identity", "gzip"]:
        a = answer(srv.port, build(srv.port, "POST", "/v1/completions", headers=[("Transfer-Encoding", te)]) +
                   chunk(body) + b"0\r\n\r\n")
        if status_of(a) not in (400, 501):
            bad.append(f"Transfer-Encoding {te!r} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


# --- 3. slow and idle clients


def raise_nofile(n=4096):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@case("slow")
def slow_clients_no_starvation(srv):
    raise_nofile()
    p = srv.port
    slow, idle, failed = [], [], 0
    stop = threading.Event()
    try:
        head = build(p, "POST", "/v1/completions", headers=[("Content-Type", "application/json"),
                                                           ("Content-Length", "1000")], close=False)
        t_open = time.monotonic()
        for _ in range(64):
            try:
                c = Conn(p, 3)
                c.try_send(head + b"{", 3)
                slow.append(c)
            except OSError:
                failed += 1
        for _ in range(200):
            try:
                idle.append(Conn(p, 3))
            except OSError:
                failed += 1

        def dribble():
            while not stop.wait(1.5):
                for c in slow:
                    c.try_send(b" ", 0.05)

        t = threading.Thread(target=dribble, daemon=True)
        t.start()
        print(f"  slow: {len(slow)} slow + {len(idle)} idle connections open after {time.monotonic() - t_open:.1f} s",
              file=sys.stderr)
        time.sleep(1.0)
        probes = []
        for _ in range(5):
            t0 = time.monotonic()
            try:
                s = request(p, "GET", "/health", timeout=2.0).status
            except (Closed, Timeout, OSError) as e:
                s = type(e).__name__
            probes.append((s, time.monotonic() - t0))
            time.sleep(0.1)
        t0 = time.monotonic()
        try:
            cs = completion(p, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}, timeout=5.0).status
        except (Closed, Timeout, OSError) as e:
            cs = type(e).__name__
        cdt = time.monotonic() - t0
    finally:
        stop.set()
        t_close = time.monotonic()
        for c in slow + idle:
            c.close()
        print(f"  slow: closing took {time.monotonic() - t_close:.1f} s", file=sys.stderr)
    desc = ", ".join(f"{s}/{dt:.2f}s" for s, dt in probes)
    check(all(s == 200 and dt < 1.0 for s, dt in probes),
          f"with 64 slow + 200 idle connections ({failed} connects failed), /health probes: {desc}; completion {cs}")
    check(cs == 200, f"a max_tokens 4 completion -> {cs} after {cdt:.2f} s (health probes fine: {desc})")


@case()
def slow_header_cut_20s(srv):
    c = Conn(srv.port, 5)
    t0 = time.monotonic()
    msg = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    i = 0
    try:
        while time.monotonic() - t0 < 20.0:
            if c.readable(1.0):
                try:
                    c.sock.settimeout(2)
                    d = c.sock.recv(4096)
                except OSError:
                    d = b""
                if not d:
                    return  # closed: cut
                check(b" 408 " in d.split(b"\r\n")[0] or b" 400 " in d.split(b"\r\n")[0],
                      f"answered an unfinished header: {short(d)}")
                return
            if not c.try_send(msg[i % len(msg):i % len(msg) + 1], 2.0):
                return  # the server closed it
            i += 1
    finally:
        c.close()
    raise CaseFail(f"a header dribbled at 1 byte/s still open after {time.monotonic() - t0:.0f} s")


# --- 4. a crowd


@case("crowd")
def crowd_200_clients_all_answered(srv):
    raise_nofile()
    n = 200
    res = [None] * n
    ready = threading.Semaphore(0)
    go = threading.Event()

    def client(i):
        try:
            c = Conn(srv.port, 10)
        except OSError as e:
            res[i] = f"connect {type(e).__name__}"
            ready.release()
            return
        ready.release()
        try:
            go.wait(20)
            if i % 2:
                c.send(build(srv.port, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}))
                r = c.read_response(10, "POST")
            else:
                c.send(build(srv.port, "GET", "/health"))
                r = c.read_response(10)
            if r.status == 200 or (r.status == 503 and r.header("retry-after")):
                res[i] = "ok"
            else:
                res[i] = f"status {r.status}" + (" without Retry-After" if r.status == 503 else "")
        except Closed as e:
            res[i] = "reset" if "reset" in str(e) else "empty reply"
        except Timeout:
            res[i] = "timeout"
        except Exception as e:
            res[i] = type(e).__name__
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 15
    for _ in range(n):
        if not ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
            break
    go.set()
    deadline = time.monotonic() + 25
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    counts = {}
    for r in res:
        k = r or "no result"
        counts[k] = counts.get(k, 0) + 1
    check(counts.get("ok", 0) == n, "200 clients: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))


# --- 6. pipelining


def kind_of(r):
    b = r.body
    if b.startswith(b"{") and b"status" in b and b"ok" in b and len(b) < 64:
        return "health"
    if b"\"data\"" in b and b"\"object\"" in b:
        return "models"
    if b"phaselab_" in b:
        return "metrics"
    if b"\"choices\"" in b:
        return "completion"
    return "?"


def pipeline(srv, reqs, want):
    p = srv.port
    c = Conn(p, 10)
    got = []
    try:
        c.send(b"".join(reqs))
        for i in range(len(reqs)):
            try:
                r = c.read_response(10, "GET")
            except (Closed, Timeout) as e:
                got.append(f"none ({e})")
                break
            got.append(f"{r.status} {kind_of(r)}")
    finally:
        c.close()
    check(got == [f"200 {w}" for w in want], f"want {want} in order, got {got}")


@case()
def pipeline_three_gets_in_order(srv):
    p = srv.port
    pipeline(srv, [build(p, "GET", "/health", close=False), build(p, "GET", "/v1/models", close=False),
                   build(p, "GET", "/metrics", close=True)], ["health", "models", "metrics"])


@case()
def pipeline_with_post_in_order(srv):
    p = srv.port
    pipeline(srv, [build(p, "GET", "/health", close=False),
                   build(p, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}, close=False),
                   build(p, "GET", "/v1/models", close=True)], ["health", "completion", "models"])


# --- 7. SIGTERM


@case("term")
def sigterm_under_load_no_fake_finish(srv):
    try:
        p = srv.port
        body = {"prompt": PROMPT, "max_tokens": srv.ctx() - 48, "temperature": 0, **srv.long_fields()}
        ref, ref_dt = timed(completion, p, body, 30.0)
        check(ref.status == 200, f"reference request -> {ref!r}")
        rj = ref.json()["choices"][0]
        ref_text, ref_finish = rj["text"], rj["finish_reason"]
        n = 8
        results = [None] * n
        conns = [Conn(p, 10) for _ in range(n)]
        go = threading.Event()

        def client(i):
            stream = i >= 6
            try:
                go.wait(10)
                conns[i].send(build(p, "POST", "/v1/completions", {**body, "stream": stream}))
                results[i] = conns[i].read_response(25, "POST")
            except Closed:
                results[i] = "closed"
            except Timeout:
                results[i] = "timeout"
            except Exception as e:
                results[i] = f"{type(e).__name__}: {e}"

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        go.set()
        time.sleep(max(0.15, min(0.5, ref_dt * 0.8)))
        srv.proc.send_signal(signal.SIGTERM)
        t_sig = time.monotonic()
        for t in threads:
            t.join(max(0.0, t_sig + 28 - time.monotonic()))
        try:
            srv.proc.wait(max(0.1, t_sig + 15 - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        for c in conns:
            c.close()
        bad, kinds = [], []
        for i, r in enumerate(results):
            stream = i >= 6
            if not isinstance(r, Resp):
                kinds.append(str(r))
                if r != "closed" and not str(r).startswith(("ConnectionResetError", "BrokenPipeError")):
                    bad.append(f"#{i} {'stream ' if stream else ''}no outcome: {r}")
                continue
            if r.status != 200:
                kinds.append(str(r.status))
                continue
            if not stream:
                try:
                    j = json.loads(r.body) if r.complete else None
                except ValueError:
                    kinds.append("200 non-JSON")
                    bad.append(f"#{i} 200 with a body that is not JSON: {short(r.body)}")
                    continue
                if j is None:
                    kinds.append("200 cut")
                    continue
                ch = j["choices"][0]
                if ch["text"] == ref_text and ch["finish_reason"] == ref_finish:
                    kinds.append("200 complete")
                else:
                    kinds.append("200 partial")
                    bad.append(f"#{i} 200 finish_reason={ch['finish_reason']!r} with {len(ch['text'])} chars "
                               f"(the whole answer is {len(ref_text)}, {ref_finish!r})")
                continue
            events = sse_data(r.body)
            text, finish, error = "", None, False
            for e in events:
                if e == "[DONE]":
                    continue
                try:
                    j = json.loads(e)
                except ValueError:
                    continue
                if "error" in j:
                    error = True
                for ch in j.get("choices", []):
                    text += ch.get("text") or ""
                    finish = ch.get("finish_reason") or finish
            if error or finish is None:
                kinds.append("stream error" if error else "stream cut")
            elif text == ref_text and finish == ref_finish:
                kinds.append("stream complete")
            else:
                kinds.append("stream partial")
                bad.append(f"#{i} stream ended with finish_reason={finish!r} after {len(text)} chars "
                           f"(the whole answer is {len(ref_text)}){' and [DONE]' if '[DONE]' in events else ''}")
        exited = srv.proc.poll()
        if exited is None:
            bad.append("the server did not exit within 15 s of SIGTERM")
        print(f"  sigterm outcomes: {kinds}; server exit {exited}; reference {ref_dt:.2f} s", file=sys.stderr)
        if all(k.endswith("complete") for k in kinds):
            print("  sigterm: warning: every request finished before SIGTERM (inconclusive)", file=sys.stderr)
        check(not bad, "; ".join(bad))
    finally:
        srv.kill()


@case("term")
def sigterm_idle_exits(srv):
    try:
        time.sleep(0.5)  # serve installs its handler just after printing the address; give it time
        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(5)
        except subprocess.TimeoutExpired:
            raise CaseFail("an idle server did not exit within 5 s of SIGTERM")
        check(rc == 0, f"exit status {rc}")
    finally:
        srv.kill()


# --- 8. fields


def bad_request(srv, body, name, path="/v1/completions"):
    r = completion(srv.port, body, path=path)
    check(r.status == 400, f"{name}: want 400, got {r!r}")
    return r


@case()
def field_response_format_400(srv):
    r = bad_request(srv, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                          "response_format": {"type": "json_object"}}, "response_format json_object",
                    "/v1/chat/completions")
    check("response_format" in r.body.decode("utf-8", "replace"), f"the error does not name response_format: {r.err_text()}")


@case()
def field_unknown_400(srv):
    r = bad_request(srv, {"prompt": PROMPT, "max_tokens": 2, "frobnicate": 1}, "unknown field frobnicate")
    check("frobnicate" in r.body.decode("utf-8", "replace"), f"the error does not name frobnicate: {r.err_text()}")


@case()
def field_max_tokens_2pow63_400(srv):
    c = Conn(srv.port, 5)
    try:
        c.send(build(srv.port, "POST", "/v1/completions", b'{"prompt": "Once", "max_tokens": 9223372036854775808}'))
        r = c.read_response(5, "POST")
    finally:
        c.close()
    check(r.status == 400, f"want 400, got {r!r}")
    t = r.body.decode("utf-8", "replace")
    check("9223372036854775808" in t and "-9223372036854775808" not in t,
          f"the message should quote 9223372036854775808 as sent: {r.err_text()}")


@case()
def field_numbers_out_of_range_400(srv):
    bad = []
    for b in [b'{"prompt":"x","max_tokens":1e400}', b'{"prompt":"x","temperature":1e400}',
              b'{"prompt":"x","max_tokens":-1}', b'{"prompt":"x","max_tokens":2.5}',
              b'{"prompt":"x","max_tokens":"5"}', b'{"prompt":"x","top_k":18446744073709551616}',
              b'{"prompt":"x","temperature":NaN}', b'{"prompt":"x","top_p":-0.0}',
              b'{"prompt":"x","max_tokens":99999999999999999999999999999}']:
        a = answer(srv.port, build(srv.port, "POST", "/v1/completions", b), 5)
        if status_of(a) != 400:
            bad.append(f"{b.decode()} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def field_prompt_token_ids_invalid_400(srv):
    bad = []
    for b in [b'{"prompt":[-1],"max_tokens":1}', b'{"prompt":[99999999],"max_tokens":1}',
              b'{"prompt":[18446744073709551615],"max_tokens":1}', b'{"prompt":[1.5],"max_tokens":1}',
              b'{"prompt":[],"max_tokens":1}', b'{"prompt":[1, "x"],"max_tokens":1}']:
        a = answer(srv.port, build(srv.port, "POST", "/v1/completions", b), 5)
        if status_of(a) != 400:
            bad.append(f"{b.decode()} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def field_logit_bias_forces_token(srv):
    base = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0}
    r0 = completion(srv.port, base)
    check(r0.status == 200, f"plain -> {r0!r}")
    t0 = r0.json()["choices"][0]["text"]
    texts = {}
    for tid in (300, 400):
        r = completion(srv.port, {**base, "logit_bias": {str(tid): 100}})
        check(r.status == 200, f"logit_bias {{{tid}: 100}} -> {r!r}")
        texts[tid] = r.json()["choices"][0]["text"]
    check(texts[300] != texts[400] and (texts[300] != t0 or texts[400] != t0),
          f"logit_bias +100 changed nothing: plain {t0!r}, token 300 {texts[300]!r}, token 400 {texts[400]!r}")
    for tid, t in texts.items():
        k = len(t) // 3
        check(k > 0 and t == t[:k] * 3, f"logit_bias +100 on {tid} should repeat that token 3 times, got {t!r}")


@case()
def field_n2_two_choices(srv):
    r = completion(srv.port, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0.8, "seed": 1, "n": 2})
    check(r.status == 200, f"n=2 -> {r!r}")
    ch = r.json()["choices"]
    check(sorted(c.get("index") for c in ch) == [0, 1], f"want choices with index 0 and 1, got {short(json.dumps(ch), 300)}")
    check(all(c.get("finish_reason") in ("stop", "length") for c in ch), "a choice without finish_reason")


@case()
def field_chat_logprobs_top3(srv):
    r = completion(srv.port, {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 4,
                              "temperature": 0, "logprobs": True, "top_logprobs": 3}, path="/v1/chat/completions")
    check(r.status == 200, f"logprobs true, top_logprobs 3 -> {r!r}")
    j = r.json()
    lp = j["choices"][0].get("logprobs")
    check(isinstance(lp, dict) and isinstance(lp.get("content"), list) and lp["content"],
          f"choices[0].logprobs.content missing: {short(json.dumps(lp), 200)}")
    check(len(lp["content"]) == j["usage"]["completion_tokens"],
          f"{len(lp['content'])} logprob entries for {j['usage']['completion_tokens']} tokens")
    for e in lp["content"]:
        check(isinstance(e.get("token"), str) and isinstance(e.get("logprob"), (int, float)) and e["logprob"] <= 0,
              f"bad entry {short(json.dumps(e), 200)}")
        tops = e.get("top_logprobs")
        check(isinstance(tops, list) and len(tops) == 3, f"top_logprobs should hold 3: {short(json.dumps(tops), 200)}")
        check(all(t["logprob"] <= 0 for t in tops), "a top logprob above 0")
        check(all(tops[k]["logprob"] >= tops[k + 1]["logprob"] for k in range(2)), "top_logprobs not sorted")
        check(abs(tops[0]["logprob"] - e["logprob"]) < 1e-3, f"greedy token's logprob {e['logprob']} is not the top {tops[0]}")


@case()
def field_completion_logprobs2(srv):
    r = completion(srv.port, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2})
    check(r.status == 200, f"logprobs 2 -> {r!r}")
    j = r.json()
    lp = j["choices"][0].get("logprobs")
    check(isinstance(lp, dict), f"choices[0].logprobs is {lp!r}")
    n = j["usage"]["completion_tokens"]
    for k in ("tokens", "token_logprobs", "top_logprobs"):
        check(isinstance(lp.get(k), list) and len(lp[k]) == n, f"logprobs.{k} should be a list of {n}: {short(json.dumps(lp.get(k)), 200)}")
    check(all(isinstance(x, (int, float)) and x <= 0 for x in lp["token_logprobs"]), f"token_logprobs {lp['token_logprobs']}")
    check(all(isinstance(d, dict) and 1 <= len(d) <= 2 and all(v <= 0 for v in d.values()) for d in lp["top_logprobs"]),
          f"top_logprobs should be dicts of 2: {short(json.dumps(lp['top_logprobs']), 200)}")
    check("".join(lp["tokens"]) == j["choices"][0]["text"], "logprobs.tokens do not spell the text")


@case()
def field_stream_n2(srv):
    r = completion(srv.port, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0.8,
                              "seed": 2, "n": 2, "stream": True}, path="/v1/chat/completions")
    check(r.status == 200, f"streamed n=2 -> {r!r}")
    ev = sse_data(r.body)
    check(ev and ev[-1] == "[DONE]", f"the stream does not end with [DONE]: {ev[-2:]}")
    idx, fin = set(), set()
    for e in ev[:-1]:
        j = json.loads(e)
        for c in j.get("choices", []):
            idx.add(c.get("index"))
            if c.get("finish_reason"):
                fin.add(c.get("index"))
    check(idx == {0, 1} and fin == {0, 1}, f"chunk indices {sorted(idx, key=str)}, finished {sorted(fin, key=str)}")


# --- auth


def auth_status(srv, values, path="/v1/models"):
    return status_of(answer(srv.port, build(srv.port, "GET", path, headers=[("Authorization", v) for v in values])))


@case("key")
def auth_basics(srv):
    got = {"none": auth_status(srv, []), "wrong": auth_status(srv, ["Bearer nope"]),
           "prefix": auth_status(srv, ["Bearer " + KEY[:-1]]), "longer": auth_status(srv, ["Bearer " + KEY + "x"]),
           "metrics none": auth_status(srv, [], "/metrics"), "right": auth_status(srv, ["Bearer " + KEY]),
           "health none": auth_status(srv, [], "/health")}
    want = {"none": 401, "wrong": 401, "prefix": 401, "longer": 401, "metrics none": 401, "right": 200, "health none": 200}
    check(got == want, f"got {got}")


@case("key")
def auth_nul_suffix_401(srv):
    s = auth_status(srv, [b"Bearer " + KEY.encode() + b"\x00junk"])
    check(s in (401, 400), f"'Bearer KEY\\x00junk' -> {s}")
    s = auth_status(srv, [b"Bearer " + KEY.encode() + b"\x00"])
    check(s in (401, 400), f"'Bearer KEY\\x00' -> {s}")


@case("key")
def auth_duplicate_header_refused(srv):
    bad = []
    for vals in (["Bearer " + KEY, "Bearer nope"], ["Bearer nope", "Bearer " + KEY]):
        s = auth_status(srv, vals)
        if s not in (400, 401):
            bad.append(f"{vals} -> {s}")
    check(not bad, "; ".join(bad))


# --- 9. cancellation


def wait_metric(port, name, pred, limit):
    deadline = time.monotonic() + limit
    v = None
    while True:
        v = metrics(port).get(name)
        if v is not None and pred(v):
            return v
        if time.monotonic() > deadline:
            return v
        time.sleep(0.05)


CANCELLED = 'phaselab_requests_total{finish="cancelled"}'


@case()
def cancel_dropped_nonstream(srv):
    p = srv.port
    wait_metric(p, "phaselab_requests_running", lambda v: v == 0, 3)
    m0 = metrics(p).get(CANCELLED, 0)
    c = Conn(p, 5)
    c.send(build(p, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": srv.ctx() - 48, "temperature": 0,
                                                  **srv.long_fields()}))
    time.sleep(0.2)
    c.close()
    v = wait_metric(p, CANCELLED, lambda v: v >= m0 + 1, 2.0)
    check(v is not None and v >= m0 + 1, f"{CANCELLED} stayed {v} (was {m0}) 2 s after the client left")
    run = wait_metric(p, "phaselab_requests_running", lambda v: v == 0, 2.0)
    check(run == 0, f"phaselab_requests_running is {run}")


@case()
def cancel_dropped_stream(srv):
    p = srv.port
    wait_metric(p, "phaselab_requests_running", lambda v: v == 0, 3)
    m0 = metrics(p).get(CANCELLED, 0)
    c = Conn(p, 5)
    try:
        c.send(build(p, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": srv.ctx() - 48, "temperature": 0,
                                                      "stream": True, **srv.long_fields()}))
        c.until(time.monotonic() + 5, lambda: c.buf.count(b"data:") >= 3)
    finally:
        c.close()
    v = wait_metric(p, CANCELLED, lambda v: v >= m0 + 1, 3.0)
    check(v is not None and v >= m0 + 1, f"{CANCELLED} stayed {v} (was {m0})")
    run = wait_metric(p, "phaselab_requests_running", lambda v: v == 0, 2.0)
    check(run == 0, f"phaselab_requests_running is {run}")
    used = wait_metric(p, "phaselab_kv_blocks_used", lambda v: v == 0, 2.0)
    check(used == 0, f"phaselab_kv_blocks_used is {used}")


# --- 10. other hostile input


@case()
def header_line_100kb_fast(srv):
    t0 = time.monotonic()
    a = answer(srv.port, build(srv.port, "GET", "/health", headers=[("X-Big", "a" * 100000)]), 3)
    dt = time.monotonic() - t0
    expect(a, {431, 400}, "a 100 KB header line")
    check(dt < 2, f"took {dt:.2f} s")


@case()
def headers_1000_refused(srv):
    t0 = time.monotonic()
    a = answer(srv.port, build(srv.port, "GET", "/health", headers=[(f"X-H{i}", "v") for i in range(1000)]), 3)
    dt = time.monotonic() - t0
    expect(a, {431, 400}, "1000 headers")
    check(dt < 2, f"took {dt:.2f} s")


@case()
def url_100kb_refused(srv):
    t0 = time.monotonic()
    a = answer(srv.port, build(srv.port, "GET", "/health?" + "a" * 100000), 3)
    dt = time.monotonic() - t0
    expect(a, {414, 431, 400}, "a 100 KB URL")
    check(dt < 2, f"took {dt:.2f} s")


@case()
def request_line_garbage_400(srv):
    bad = []
    for data, want in [(b"GARBAGE\r\nHost: 127.0.0.1\r\n\r\n", {400}), (b"GET\r\nHost: 127.0.0.1\r\n\r\n", {400}),
                       (b"GET /health HTTP/1.1 extra\r\nHost: 127.0.0.1\r\n\r\n", {400, 505}),
                       (b"\r\n\r\n\r\n\r\n", {400}), (b"GET /hea lth HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", {400, 404})]:
        a = answer(srv.port, data, 3)
        if status_of(a) not in want:
            bad.append(f"{data[:30]!r} -> {status_of(a)}")
    a = answer(srv.port, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40 + b"\r\n\r\n", 3)
    if status_of(a) not in (400, "closed", "reset"):
        bad.append(f"a TLS ClientHello -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def http_version_bogus(srv):
    bad = []
    for v in ["HTTP/9.9", "HTTP/1.1.1", "HTTP/x", "HTTPS/1.1"]:
        a = answer(srv.port, build(srv.port, "GET", "/health", version=v), 3)
        if status_of(a) not in (400, 505):
            bad.append(f"{v} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def http09_request_no_hang(srv):
    t0 = time.monotonic()
    a = answer(srv.port, b"GET /\r\n", 3)
    dt = time.monotonic() - t0
    check(status_of(a) in (400, 505, "closed", "reset"), f"'GET /\\r\\n' -> {status_of(a)} after {dt:.1f} s")


@case()
def method_absurd_refused(srv):
    bad = []
    for m in ["FROBNICATE", "G" * 5000, "GET\x7f", "TRACE", "CONNECT"]:
        path = "127.0.0.1:80" if m == "CONNECT" else "/health"
        a = answer(srv.port, build(srv.port, m, path), 3)
        if status_of(a) not in (400, 405, 501):
            bad.append(f"{short(m, 20)} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def wrong_method_on_endpoint(srv):
    bad = []
    for m, path in [("GET", "/v1/completions"), ("DELETE", "/v1/models"), ("PUT", "/v1/chat/completions")]:
        a = answer(srv.port, build(srv.port, m, path, b"{}" if m == "PUT" else None), 3)
        if status_of(a) not in (404, 405):
            bad.append(f"{m} {path} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def json_non_utf8_400(srv):
    bad = []
    for path, b in [("/v1/completions", b'{"prompt": "\xff\xfe\xfd", "max_tokens": 2}'),
                    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi \xc3\x28"}], "max_tokens": 2}'),
                    ("/v1/completions", b'\xef\xbb\xbf\xff{"prompt": "x"}')]:
        a = answer(srv.port, build(srv.port, "POST", path, b), 5)
        if status_of(a) != 400:
            bad.append(f"{b[:30]!r} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def json_deep_nesting_400(srv):
    bad = []
    for b in [b"[" * 100000, b'{"a":' * 50000 + b"1" + b"}" * 50000,
              b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}",
              b'{"messages": [{"role": "user", "content": ' + b"[" * 100000 + b"]" * 100000 + b"}]}"]:
        path = "/v1/chat/completions" if b.startswith(b'{"messages"') else "/v1/completions"
        a = answer(srv.port, build(srv.port, "POST", path, b), 8)
        if status_of(a) != 400:
            bad.append(f"{b[:12]!r}... -> {status_of(a)}")
        if not srv.alive():
            raise CaseFail(f"the server died on {b[:12]!r}...")
    check(not bad, "; ".join(bad))


@case()
def json_not_object_400(srv):
    bad = []
    for b in [b"", b"null", b"[1]", b'"x"', b"{}", b'{"prompt": "x"} {"prompt": "y"}', b'{"prompt": "x",}']:
        a = answer(srv.port, build(srv.port, "POST", "/v1/completions", b), 5)
        if status_of(a) != 400:
            bad.append(f"{b!r} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def prompt_over_context_400_fast(srv):
    bad = []
    for path, body in [("/v1/completions", {"prompt": "hello " * 5000, "max_tokens": 4}),
                       ("/v1/completions", {"prompt": [5] * 5000, "max_tokens": 4}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}] * 2000, "max_tokens": 4}),
                       ("/v1/completions", {"prompt": "a" * 3000000, "max_tokens": 4})]:
        t0 = time.monotonic()
        r = completion(srv.port, body, 10, path)
        dt = time.monotonic() - t0
        code = None
        try:
            code = json.loads(r.body)["error"]["code"]
        except Exception:
            pass
        huge_ok = len(json.dumps(body)) > 1000000 and r.status == 413  # a 3 MB body may meet --max-body first
        if not huge_ok and (r.status != 400 or code != "context_length_exceeded") or dt > 3:
            bad.append(f"{path} {short(json.dumps(body), 30)} -> {r.status} code={code} in {dt:.2f} s")
    check(not bad, "; ".join(bad))


@case()
def client_closes_mid_body(srv):
    p = srv.port
    for _ in range(5):
        c = Conn(p, 5)
        c.send(build(p, "POST", "/v1/completions", headers=[("Content-Type", "application/json"),
                                                            ("Content-Length", "1000")]) + b'{"prompt": "x"')
        c.close()
    time.sleep(0.3)
    r, dt = timed(request, p, "GET", "/health", timeout=3)
    check(r.status == 200 and dt < 1, f"/health after 5 half-sent bodies -> {r.status} in {dt:.2f} s")
    run = wait_metric(p, "phaselab_requests_running", lambda v: v == 0, 2.0)
    check(run == 0, f"phaselab_requests_running is {run}")


@case()
def half_close_still_answered(srv):
    # A request answered at once is answered after the client shuts its
    # sending side. A completion is not: a FIN is how a client that gives up
    # looks, so the server takes it as gone (as llama-server and vLLM do) and
    # cancels the work (docs/serving.md); it must neither hang nor crash.
    p = srv.port
    r = raw(p, build(p, "GET", "/health"), 5, shut_wr=True)
    check(r.status == 200, f"GET /health then SHUT_WR -> {r!r}")
    try:
        r = raw(p, build(p, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2000, "temperature": 0}), 10,
                shut_wr=True)
        check(r.status == 200 and r.complete, f"a completion then SHUT_WR -> {r!r}")
    except Closed:
        pass  # taken as gone and cancelled: fine
    r = raw(p, build(p, "GET", "/health"), 5)
    check(r.status == 200, f"the server answers after a half-closed completion -> {r!r}")


@case()
def head_request_has_no_body(srv):
    # An answer to HEAD is a head alone: a body would be read as the next
    # response on a kept-alive connection.
    p = srv.port
    c = Conn(p, 5)
    try:
        c.sock.sendall(build(p, "HEAD", "/health", close=False) + build(p, "GET", "/health", close=False))
        data = b""
        deadline = time.monotonic() + 5
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"}") and time.monotonic() < deadline:
            c.sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                d = c.sock.recv(65536)
            except socket.timeout:
                break
            if not d:
                break
            data += d
        heads = data.split(b"HTTP/1.1 ")[1:]
        check(len(heads) == 2, f"two responses expected: {short(data)}")
        check(heads[0].split(b"\r\n\r\n", 1)[1] == b"", f"HEAD's answer carried a body: {short(heads[0])}")
        check(heads[1].startswith(b"200") and heads[1].endswith(b'{"status":"ok"}'), f"then GET: {short(heads[1])}")
    finally:
        c.close()


@case()
def keepalive_20_requests_one_connection(srv):
    p = srv.port
    c = Conn(p, 10)
    try:
        for i in range(20):
            if i % 3 == 0:
                req = build(p, "GET", "/health", close=False)
            elif i % 3 == 1:
                req = build(p, "GET", "/v1/models", close=False)
            else:
                req = build(p, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}, close=False)
            check(c.try_send(req), f"request {i + 1}: the connection is gone")
            try:
                r = c.read_response(10, "GET")
            except (Closed, Timeout) as e:
                raise CaseFail(f"request {i + 1} of 20: {e}")
            check(r.status == 200, f"request {i + 1}: {r!r}")
            if i < 19:
                check((r.header("connection") or "").lower() != "close",
                      f"the server closes the connection after request {i + 1} of 20")
    finally:
        c.close()


@case()
def query_string_ok(srv):
    bad = []
    for path in ["/health?x=1", "/v1/models?limit=1&after=%20", "/metrics?name[]=a", "/health?"]:
        a = answer(srv.port, build(srv.port, "GET", path), 3)
        if status_of(a) != 200:
            bad.append(f"{path} -> {status_of(a)}")
    a = answer(srv.port, build(srv.port, "POST", "/v1/completions?stream=true",
                               {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}), 5)
    if status_of(a) != 200:
        bad.append(f"POST /v1/completions?stream=true -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def path_traversal_404(srv):
    bad = []
    for path in ["/../../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/v1/../../etc/passwd", "//etc/passwd",
                 "/v1/models/..%2f..%2fetc%2fpasswd", "/v1/models/../../../../../etc/passwd", "/..", "/%00",
                 "/health/../../etc/passwd", "*"]:
        a = answer(srv.port, build(srv.port, "GET", path), 3)
        if status_of(a) not in (400, 404):
            bad.append(f"{path} -> {status_of(a)}")
        elif isinstance(a, Resp) and b"root:" in a.body:
            bad.append(f"{path} leaks /etc/passwd")
    check(not bad, "; ".join(bad))


@case()
def nul_in_path_refused(srv):
    a = answer(srv.port, build(srv.port, "GET", "/health\x00/../etc/passwd"), 3)
    expect(a, {400, 404}, "NUL in the path")


@case()
def header_malformed_400(srv):
    bad = []
    for line in [b"Host : 127.0.0.1", b"No colon here", b": empty-name", b"X-A\x00B: 1", b"X Space: 1",
                 b"\x00\x01\x02"]:
        data = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + line + b"\r\nConnection: close\r\n\r\n"
        if line.startswith(b"Host :"):
            data = b"GET /health HTTP/1.1\r\n" + line + b"\r\nConnection: close\r\n\r\n"
        a = answer(srv.port, data, 3)
        if status_of(a) != 400:
            bad.append(f"{line!r} -> {status_of(a)}")
    check(not bad, "; ".join(bad))


@case()
def expect_100_continue(srv):
    p = srv.port
    body = json.dumps({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}).encode()
    c = Conn(p, 10)
    try:
        head = build(p, "POST", "/v1/completions", headers=[("Content-Type", "application/json"), ("Expect", "100-continue"),
                                                          ("Content-Length", str(len(body)))])
        c.send(head)
        if c.readable(1.0):
            c.until(time.monotonic() + 2, lambda: b"\r\n\r\n" in c.buf)
            check(c.buf.startswith(b"HTTP/1.1 100"), f"instead of 100 Continue: {short(c.buf)}")
        c.send(body)
        r = c.read_response(10, "POST")
    finally:
        c.close()
    check(r.status == 200, f"-> {r!r}")


@case()
def server_survives_burst_of_resets(srv):
    p = srv.port
    for i in range(50):
        try:
            s = socket.create_connection(("127.0.0.1", p), timeout=3)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            if i % 2:
                s.sendall(build(p, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 50}))
            s.close()  # RST
        except OSError:
            pass
    time.sleep(0.3)
    r, dt = timed(request, p, "GET", "/health", timeout=3)
    check(r.status == 200 and dt < 1, f"/health after 50 reset connections -> {r.status} in {dt:.2f} s")
    run = wait_metric(p, "phaselab_requests_running", lambda v: v == 0, 3.0)
    check(run == 0, f"phaselab_requests_running is {run} after the resets")


# --- the end


@case(None)
def servers_alive_at_end(_srv):
    if not any(k != "term" for k in SERVERS):
        get_server("main")
    bad, info = [], []
    for kind, s in SERVERS.items():
        if kind == "term":
            continue
        hwm = s.proc_kb("VmHWM")
        info.append(f"{kind} {hwm / 1024:.0f} MB" if hwm else f"{kind} ?")
        if not s.alive():
            bad.append(f"{kind} server is dead (exit {s.proc.poll()}): {s.stderr_tail()}")
            continue
        try:
            r = request(s.port, "GET", "/health", timeout=2)
            if r.status != 200:
                bad.append(f"{kind} /health -> {r.status}")
        except (Closed, Timeout, OSError) as e:
            bad.append(f"{kind} /health: {type(e).__name__} {e}")
        # Memory: whatever the clients sent, at most --max-body x --parallel
        # above the idle server, plus 16 MiB for a pass's work buffers and
        # the allocator's slack. (Not under ASan: its quarantine keeps freed
        # memory resident on purpose.)
        if hwm and not s.instrumented():
            args = dict(zip(s.args[::2], s.args[1::2]))
            bound_kb = s.base_rss_kb + int(args.get("--max-body", 4 << 20)) * int(args.get("--parallel", 8)) // 1024 + 16 * 1024
            if hwm > bound_kb:
                bad.append(f"{kind}: peak RSS {hwm // 1024} MB above the bound {bound_kb // 1024} MB "
                           f"(idle {s.base_rss_kb // 1024} MB + --max-body x --parallel + 16)")
    print("  peak RSS (VmHWM): " + ", ".join(info), file=sys.stderr)
    check(not bad, "; ".join(bad))


# ---------------------------------------------------------------- runner


def run_case(name, kind, fn):
    srv = None
    if kind:
        try:
            srv = get_server(kind)
        except Exception as e:
            return f"fail: cannot start the {kind} server: {e}"
    result = [None]

    def body():
        try:
            fn(srv)
            result[0] = "pass"
        except CaseFail as e:
            result[0] = f"fail: {e}"
        except Closed as e:
            result[0] = f"fail: {e}"
        except Timeout as e:
            result[0] = f"fail: timed out waiting for the server ({e})"
        except Exception as e:
            result[0] = f"fail: {type(e).__name__}: {e}"

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(CASE_LIMIT_S)
    if t.is_alive():
        result[0] = f"fail: the case did not finish in {CASE_LIMIT_S:.0f} s"
    if srv is not None and kind != "term" and not srv.alive():
        result[0] = f"fail: the server died (exit {srv.proc.poll()}); stderr: {srv.stderr_tail()}" + (
            "" if result[0] == "pass" else f"; case: {result[0]}")
    return result[0] or "fail: no result"


def main(argv):
    global CLI, MODEL
    out = os.environ.get("HOSTILE_JSON")
    pos = []
    i = 0
    while i < len(argv):
        if argv[i] == "--json" and i + 1 < len(argv):
            out = argv[i + 1]
            i += 2
            continue
        if argv[i].startswith("--json="):
            out = argv[i].split("=", 1)[1]
        elif argv[i] == "--list":
            print("\n".join(n for n, _, _ in CASES))
            return 0
        elif argv[i] in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            pos.append(argv[i])
        i += 1
    if len(pos) < 2:
        print("usage: hostile_clients.py PHASELAB_CLI MODEL.gguf [--json OUT] [--list] [CASE ...]", file=sys.stderr)
        return 2
    CLI, MODEL = pos[0], pos[1]
    names = {n for n, _, _ in CASES}
    unknown = [n for n in pos[2:] if n not in names]
    if unknown:
        print("unknown case(s): " + ", ".join(unknown) + " (--list lists them)", file=sys.stderr)
        return 2
    selected = [c for c in CASES if not pos[2:] or c[0] in pos[2:]]
    atexit.register(kill_all)

    def on_signal(sig, _frame):
        kill_all()
        os._exit(128 + sig)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    results = {}
    t_all = time.monotonic()
    for name, kind, fn in selected:
        t0 = time.monotonic()
        res = run_case(name, kind, fn)
        results[name] = res
        line = f"PASS {name}" if res == "pass" else f"FAIL {name}: {res[len('fail: '):]}"
        print(short(line, 600), flush=True)
        print(f"  ({name}: {time.monotonic() - t0:.2f} s)", file=sys.stderr, flush=True)
    passed = sum(1 for r in results.values() if r == "pass")
    failed = len(results) - passed
    print(f"  total {time.monotonic() - t_all:.1f} s", file=sys.stderr)
    if out:
        try:
            with open(out, "w") as f:
                json.dump({k: (v if v == "pass" else short(v, 600)) for k, v in results.items()}, f, indent=1)
        except OSError as e:
            print(f"cannot write {out}: {e}", file=sys.stderr)
    print(f"{passed} passed, {failed} failed", flush=True)
    kill_all()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
