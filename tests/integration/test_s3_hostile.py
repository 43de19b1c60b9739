#!/usr/bin/env python3
"""A real ckptd with an s3:// root on a fake S3 store that misbehaves.

The store is an in-memory S3 written here (http.server in a thread, on a
127.0.0.1 port the kernel picks): buckets, objects, If-None-Match, ranged
GETs, multipart uploads, ListObjectsV2 and ListMultipartUploads; it does not
check signatures. Saves are ckpt_fixture's (one rank, shards of several
5 MiB parts: multipart uploads), reads are `ckptctl verify` (the restore
path: manifest, HEAD, ranged GETs). Once the agent is up and a first step
is committed, the store is made to misbehave, one way at a time:

  - CreateMultipartUpload answered without an UploadId
  - CompleteMultipartUpload answered 200 with an <Error> body (tried
    --s3-max-tries times, then the upload aborted)
  - a HEAD after the completion saying the wrong Content-Length
  - a part's ETag holding markup (it would go into CompleteMultipartUpload)
  - ListObjectsV2 naming keys outside the prefix asked for, answering a
    proxy's HTML page, saying IsTruncated=true without a token, or with the
    same token for ever (`ckptctl delete`: refused, nothing removed)
  - a listed key "step-1/../step-2/manifest.json": removing step 1 leaves
    step 2 whole (the key is a key, not a path to resolve)
  - ListMultipartUploads truncated without markers, or with the same
    markers for ever (a second agent's clean-up at its start: it gives up)
  - a GET of a manifest announcing a body of 1 GiB (refused before its body)
  - a ranged GET answered with other bytes than those asked for
  - 503 SlowDown to every request
  - a connection accepted and never answered (--s3-timeout 2)

Each time: the agent stays up and answers `ckptctl status`; a save FAILS
with a reason that names the problem, within a bounded time and a bounded
number of requests; no manifest of a failed step is in the store, LATEST
still names the last good step, and no multipart upload is left open.
Then the store behaves again and a save commits and verifies; a store
that throttles (429 to each request the first time) has each request tried
again, and a save commits and verifies through it. Last, the
agent is stopped while the store holds a request unanswered, and must
exit, cleanly, in time.

Beside it, a store that ignores If-None-Match (every PUT replaces), with
two agents (nodes w0 and w1, a job of world 2): both find out at start
that create-once is not atomic there, and only rank 0's node writes
manifests: while its PUTs of a step's manifest fail, the other node never
takes over (two writers could replace a committed manifest), the step
FAILS at the deadline on both, and `ckptctl commit --finish` commits it by
hand.

Environment: CKPTD_BIN, CKPTCTL_BIN, CKPT_FIXTURE_BIN (set by CMake);
CK_TMPDIR for the temporary directory. Python 3 standard library only.
Exits 77 (skipped) when something it needs is missing.
"""

import hashlib
import http.server
import os
import re
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from xml.sax.saxutils import escape

BUCKET = "hostile"
PREFIX = "ckpt/run1"
JOB = "hjob"
GIB = 1 << 30


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


class Failed(Exception):
    pass


def check(cond, why):
    if not cond:
        raise Failed(why)


# ---- the store --------------------------------------------------------------


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def etag_of(b):
    return hashlib.md5(b).hexdigest()


class Store:
    """What the fake S3 holds, and how it misbehaves now (fault: a name or None)."""

    def __init__(self):
        self.mu = threading.Lock()
        self.objects = {}  # key -> (bytes, mtime)
        self.uploads = {}  # upload id -> [key, {part: bytes}, initiated]
        self.seq = 0
        self.fault = None
        self.requests = []  # (method, key, query) of every request, in order
        self.sent_bytes = 0  # of the last huge body
        self.release = threading.Event()  # frees the handlers a fault holds
        self.ignore_inm = False  # If-None-Match ignored: every PUT replaces
        self.who = []  # (access key, method, key) of every request, in order
        self.throttled = set()  # (method, path) answered 429 once already

    def set_fault(self, name):
        with self.mu:
            self.fault = name
            self.requests = []
            self.throttled = set()

    def count(self, pred):
        with self.mu:
            return sum(1 for r in self.requests if pred(*r))

    def keys(self):
        with self.mu:
            return sorted(self.objects)


def qs(query):
    return {k: v[0] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store = None  # set on the class by serve()

    def log_message(self, fmt, *args):  # quiet: the test prints what matters
        pass

    # -- replies --

    def reply(self, status, body=b"", headers=None, head=False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if isinstance(body, str):
            body = body.encode()
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def error(self, status, code, msg, head=False):
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{escape(msg)}</Message><RequestId>tx1</RequestId></Error>")
        self.reply(status, body, {"Content-Type": "application/xml"}, head)

    def xml(self, body):
        self.reply(200, '<?xml version="1.0" encoding="UTF-8"?>\n' + body,
                   {"Content-Type": "application/xml"})

    # -- the request --

    def parse(self):
        u = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(u.path)
        parts = path.lstrip("/").split("/", 1)
        self.bucket = parts[0]
        self.key = parts[1] if len(parts) > 1 else ""
        self.q = qs(u.query)
        n = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(n) if n else b""
        m = re.search(r"Credential=([^/,]+)/", self.headers.get("Authorization") or "")
        with self.store.mu:
            self.store.requests.append((self.command, self.key, u.query))
            self.store.who.append((m.group(1) if m else "", self.command, self.key))
            self.fault = self.store.fault

    def held(self):
        """A fault that answers nothing: the connection held until the test lets go."""
        self.store.release.wait(60)
        self.close_connection = True

    def common_faults(self):
        """The faults every kind of request meets; True if one answered."""
        if self.fault == "slowdown":
            self.error(503, "SlowDown", "Please reduce your request rate.",
                       self.command == "HEAD")
            return True
        if self.fault == "throttle":  # each request refused once, as a busy store does
            with self.store.mu:
                first = (self.command, self.path) not in self.store.throttled
                self.store.throttled.add((self.command, self.path))
            if first:
                self.error(429, "TooManyRequests", "Please reduce your request rate.",
                           self.command == "HEAD")
                return True
        if self.fault == "silent" and (self.key or self.command != "HEAD"):
            self.held()  # the bucket's HEAD (the root check) still answers
            return True
        if self.fault == "silent_shards" and self.key.endswith(".safetensors"):
            self.held()
            return True
        return False

    def do_HEAD(self):
        self.parse()
        if self.common_faults():
            return
        if self.bucket != BUCKET:
            return self.error(404, "NoSuchBucket", "no such bucket", head=True)
        if not self.key:
            return self.reply(200, head=True)
        with self.store.mu:
            obj = self.store.objects.get(self.key)
        if obj is None:
            return self.error(404, "NoSuchKey", "no such key", head=True)
        size = len(obj[0])
        if self.fault == "head_wrong_size" and self.key.endswith(".safetensors"):
            size += 4096
        self.reply(200, headers={"Content-Length": str(size), "ETag": f'"{etag_of(obj[0])}"',
                                 "Last-Modified": self.date_time_string(obj[1])}, head=True)

    def do_GET(self):
        self.parse()
        if self.common_faults():
            return
        if self.bucket != BUCKET:
            return self.error(404, "NoSuchBucket", "no such bucket")
        if not self.key and "list-type" in self.q:
            return self.list_objects()
        if not self.key and "uploads" in self.q:
            return self.list_uploads()
        with self.store.mu:
            obj = self.store.objects.get(self.key)
        if obj is None:
            return self.error(404, "NoSuchKey", "no such key")
        data = obj[0]
        if self.fault == "huge_get" and self.key.endswith("/manifest.json"):
            return self.huge(data)
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng)
            if not m:
                return self.error(400, "InvalidRange", rng)
            a, b = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            if a >= len(data):
                return self.error(416, "InvalidRange", rng)
            if self.fault == "wrong_range" and b + 1 < len(data):
                a, b = a + 1, b + 1  # the next bytes, and a Content-Range that says so
            return self.reply(206, data[a:b + 1],
                              {"Content-Range": f"bytes {a}-{b}/{len(data)}"})
        self.reply(200, data, {"ETag": f'"{etag_of(data)}"'})

    def huge(self, data):
        """Content-Length: 1 GiB, then the object and zeros until the reader hangs up."""
        self.send_response(200)
        self.send_header("Content-Length", str(GIB))
        self.end_headers()
        sent, chunk = 0, data + b"\0" * (65536 - len(data) % 65536)
        try:
            while sent < GIB:
                self.wfile.write(chunk)
                sent += len(chunk)
                chunk = b"\0" * 65536
                with self.store.mu:
                    self.store.sent_bytes = sent
        except OSError:
            pass
        self.close_connection = True

    def do_PUT(self):
        self.parse()
        if self.common_faults():
            return
        if "uploadId" in self.q:
            with self.store.mu:
                up = self.store.uploads.get(self.q["uploadId"])
                if up is None or up[0] != self.key:
                    up = None
                else:
                    up[1][int(self.q["partNumber"])] = self.body
            if up is None:
                return self.error(404, "NoSuchUpload", "no such upload")
            if self.fault == "bad_etag":  # markup that would land in CompleteMultipartUpload
                return self.reply(200, headers={"ETag": '"x</ETag></Part><Part>"'})
            return self.reply(200, headers={"ETag": f'"{etag_of(self.body)}"'})
        if self.fault == "manifest_2_fails" and self.key.endswith(
                "step-000000000002/manifest.json"):
            return self.error(500, "InternalError", "We encountered an internal error.")
        with self.store.mu:
            if self.headers.get("If-None-Match") == "*" and self.key in self.store.objects \
                    and not self.store.ignore_inm:
                exists = True
            else:
                exists = False
                self.store.objects[self.key] = (self.body, time.time())
        if exists:
            return self.error(412, "PreconditionFailed", "the key exists")
        self.reply(200, headers={"ETag": f'"{etag_of(self.body)}"'})

    def do_POST(self):
        self.parse()
        if self.common_faults():
            return
        if "uploads" in self.q:
            with self.store.mu:
                self.store.seq += 1
                uid = f"2~up{self.store.seq}"
                self.store.uploads[uid] = [self.key, {}, time.time()]
            if self.fault == "no_upload_id":
                return self.xml(f"<InitiateMultipartUploadResult><Bucket>{BUCKET}</Bucket>"
                                f"<Key>{escape(self.key)}</Key></InitiateMultipartUploadResult>")
            return self.xml(f"<InitiateMultipartUploadResult><Bucket>{BUCKET}</Bucket>"
                            f"<Key>{escape(self.key)}</Key><UploadId>{uid}</UploadId>"
                            "</InitiateMultipartUploadResult>")
        if "uploadId" in self.q:
            if self.fault == "complete_error":
                return self.xml("<Error><Code>InternalError</Code><Message>We encountered an "
                                "internal error. Please try again.</Message></Error>")
            nums = [int(n) for n in re.findall(r"<PartNumber>(\d+)</PartNumber>",
                                               self.body.decode())]
            with self.store.mu:
                up = self.store.uploads.pop(self.q["uploadId"], None)
                if up is not None and up[0] == self.key and nums and \
                        all(n in up[1] for n in nums):
                    data = b"".join(up[1][n] for n in nums)
                    self.store.objects[self.key] = (data, time.time())
                else:
                    up = None
            if up is None:
                return self.error(400, "InvalidPart", "no such upload or part")
            return self.xml(f"<CompleteMultipartUploadResult><Bucket>{BUCKET}</Bucket>"
                            f"<Key>{escape(self.key)}</Key><ETag>\"{etag_of(data)}-{len(nums)}"
                            "\"</ETag></CompleteMultipartUploadResult>")
        self.error(400, "InvalidRequest", "POST of what")

    def do_DELETE(self):
        self.parse()
        if self.common_faults():
            return
        with self.store.mu:
            if "uploadId" in self.q:
                found = self.store.uploads.pop(self.q["uploadId"], None) is not None
            else:
                found = True
                self.store.objects.pop(self.key, None)
        if not found:
            return self.error(404, "NoSuchUpload", "no such upload")
        self.reply(204)

    # -- listings --

    def list_objects(self):
        prefix, delim = self.q.get("prefix", ""), self.q.get("delimiter", "")
        with self.store.mu:
            keys = sorted(k for k in self.store.objects if k.startswith(prefix))
            objs = {k: self.store.objects[k] for k in keys}
        contents, common = [], []
        for k in keys:
            rest = k[len(prefix):]
            if delim and delim in rest:
                p = prefix + rest[:rest.index(delim) + 1]
                if p not in common:
                    common.append(p)
            else:
                contents.append(k)
        more = ""
        if self.fault == "list_not_xml":
            return self.reply(200, "<html><body>a proxy's page</body></html>",
                              {"Content-Type": "text/html"})
        if self.fault == "list_outside":
            contents.append("somewhere/else/step-000000000001/manifest.json")
            objs["somewhere/else/step-000000000001/manifest.json"] = (b"{}", time.time())
        elif self.fault == "list_dotdot" and prefix.endswith("/step-000000000001/"):
            # a key under the prefix, as a string, that names another step's manifest as a path
            odd = prefix + "../step-000000000002/manifest.json"
            contents.append(odd)
            objs[odd] = (b"{}", time.time())
        elif self.fault == "list_no_token":
            more = "<IsTruncated>true</IsTruncated>"
        elif self.fault == "list_same_token":
            more = ("<IsTruncated>true</IsTruncated>"
                    "<NextContinuationToken>again</NextContinuationToken>")
        else:
            more = "<IsTruncated>false</IsTruncated>"
        body = [f"<ListBucketResult><Name>{BUCKET}</Name><Prefix>{escape(prefix)}</Prefix>"
                f"<KeyCount>{len(contents) + len(common)}</KeyCount>"
                f"<MaxKeys>1000</MaxKeys>{more}"]
        for k in contents:
            data, mtime = objs[k]
            body.append(f"<Contents><Key>{escape(k)}</Key><LastModified>{iso(mtime)}"
                        f"</LastModified><ETag>&quot;{etag_of(data)}&quot;</ETag>"
                        f"<Size>{len(data)}</Size></Contents>")
        for p in common:
            body.append(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>")
        body.append("</ListBucketResult>")
        self.xml("".join(body))

    def list_uploads(self):
        prefix = self.q.get("prefix", "")
        with self.store.mu:
            ups = sorted((u[0], uid, u[2]) for uid, u in self.store.uploads.items()
                         if u[0].startswith(prefix))
        if self.fault == "uploads_same_marker":
            more = ("<IsTruncated>true</IsTruncated><NextKeyMarker>k</NextKeyMarker>"
                    "<NextUploadIdMarker>u</NextUploadIdMarker>")
        elif self.fault == "uploads_no_marker":
            more = "<IsTruncated>true</IsTruncated>"
        else:
            more = "<IsTruncated>false</IsTruncated>"
        body = [f"<ListMultipartUploadsResult><Bucket>{BUCKET}</Bucket><KeyMarker></KeyMarker>"
                f"<UploadIdMarker></UploadIdMarker><Prefix>{escape(prefix)}</Prefix>"
                f"<MaxUploads>1000</MaxUploads>{more}"]
        for key, uid, t in ups:
            body.append(f"<Upload><Key>{escape(key)}</Key><UploadId>{uid}</UploadId>"
                        f"<Initiated>{iso(t)}</Initiated></Upload>")
        body.append("</ListMultipartUploadsResult>")
        self.xml("".join(body))


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = False  # handlers a fault holds are let go by Store.release
    allow_reuse_address = True


def serve(store):
    Handler.store = store
    srv = Server(("127.0.0.1", 0), Handler)  # a port of the kernel's choosing
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# ---- the agent -----------------------------------------------------------------


class Agent:
    def __init__(self, tmp, endpoint, node="h0", access_key="hostile"):
        os.makedirs(tmp, exist_ok=True)
        self.ckptctl = os.environ["CKPTCTL_BIN"]
        self.sock = "unix:" + os.path.join(tmp, "ckptd.sock")
        creds = os.path.join(tmp, "s3.creds")
        fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, f"access_key = {access_key}\nsecret_key = not-checked\n".encode())
        os.close(fd)
        self.log_path = os.path.join(tmp, "agent.log")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [os.environ["CKPTD_BIN"], "--config", "/dev/null",
             "--root", f"s3://{BUCKET}/{PREFIX}", "--listen", self.sock, "--node", node,
             "--s3-endpoint", endpoint, "--s3-credentials", creds,
             "--s3-timeout", "2", "--s3-max-tries", "2", "--s3-connections", "4",
             "--staging-mb", "64", "--chunk-mb", "5", "--commit-deadline", "20",
             "--log-level", "info"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

    def log_tail(self, n=4000):
        with open(self.log_path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")

    def ctl(self, *args, timeout=30):
        try:
            return subprocess.run([self.ckptctl, "--endpoint", self.sock, *args],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failed(f"'ckptctl {' '.join(args)}' did not finish within {timeout} s")

    def wait_ready(self, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failed(f"ckptd exited at start with {self.proc.returncode}:\n"
                             + self.log_tail())
            if self.ctl("status").returncode == 0:
                return
            time.sleep(0.1)
        raise Failed(f"ckptd did not answer 'ckptctl status' within {seconds} s")

    def alive(self, what):
        check(self.proc.poll() is None,
              f"{what}: ckptd exited with {self.proc.returncode}:\n{self.log_tail()}")
        r = self.ctl("status", timeout=10)
        check(r.returncode == 0, f"{what}: 'ckptctl status' failed: {r.stderr}")

    def save(self, step, seconds=40, rank=0, world=1):
        """ckpt_fixture's save of step: (exit code, stderr, seconds taken)."""
        t0 = time.monotonic()
        try:
            r = subprocess.run([os.environ["CKPT_FIXTURE_BIN"], "--endpoint", self.sock,
                                "--job", JOB, "--step", str(step), "--seed", str(step),
                                "--rank", str(rank), "--world", str(world)],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=seconds)
        except subprocess.TimeoutExpired:
            raise Failed(f"the save of step {step} did not end within {seconds} s")
        return r.returncode, r.stderr, time.monotonic() - t0

    def stop(self, seconds=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


# ---- the checks ------------------------------------------------------------------


def committed_steps(store):
    pat = re.compile(re.escape(f"{PREFIX}/{JOB}/step-") + r"(\d{12})/manifest\.json$")
    return sorted(int(m.group(1)) for k in store.keys() if (m := pat.match(k)))


def latest(store):
    with store.mu:
        obj = store.objects.get(f"{PREFIX}/{JOB}/LATEST")
    return int(obj[0].decode().strip()) if obj else None


def uploads_left(store, seconds=10):
    """Open multipart uploads, once the agent's aborts (asynchronous) are in."""
    deadline = time.monotonic() + seconds
    while True:
        with store.mu:
            left = [u[0] for u in store.uploads.values()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def save_fails(agent, store, step, good, words, within):
    """A save of step that must FAIL, naming `words`; nothing of it committed."""
    rc, err, took = agent.save(step)
    check(rc != 0, f"step {step}: the save succeeded on a store answering '{store.fault}'")
    check(re.search(words, err), f"step {step}: the reason does not say /{words}/:\n{err}")
    check(took < within, f"step {step}: the save took {took:.1f} s to fail (at most {within})")
    agent.alive(f"after step {step}")
    check(step not in committed_steps(store), f"step {step}: a manifest is in the store")
    check(latest(store) == good, f"step {step}: LATEST is {latest(store)}, not {good}")
    return err


def scenario_no_upload_id(agent, store, good, tmp):
    store.set_fault("no_upload_id")
    save_fails(agent, store, 101, good, r"no usable UploadId", 20)
    # the upload the store opened is not the agent's to know: only the store keeps it
    store.set_fault(None)
    with store.mu:
        store.uploads.clear()


def scenario_complete_error(agent, store, good, tmp):
    store.set_fault("complete_error")
    save_fails(agent, store, 102, good, r"InternalError", 20)
    # the 200 is not a success: it was tried again (max_tries 2), never more
    posts = store.count(lambda m, k, q: m == "POST" and q.startswith("uploadId="))
    check(posts == 2, f"CompleteMultipartUpload sent {posts} times, want 2 (--s3-max-tries)")
    check(not any(k.endswith(".safetensors") and "step-000000000102" in k
                  for k in store.keys()), "step 102: a shard object was made")
    left = uploads_left(store)
    check(not left, f"step 102: uploads left open: {left}")


def scenario_head_wrong_size(agent, store, good, tmp):
    store.set_fault("head_wrong_size")
    save_fails(agent, store, 103, good, r"the store holds \d+ bytes, \d+ were written", 20)


def scenario_listings(agent, store, good, tmp):
    for fault, words in (("list_outside", r"not a listing of it"),
                         ("list_not_xml", r"not a listing of it"),
                         ("list_no_token", r"truncated without a usable token"),
                         ("list_same_token", r"token")):
        store.set_fault(fault)
        t0 = time.monotonic()
        r = agent.ctl("delete", JOB, str(good - 1), timeout=30)
        took = time.monotonic() - t0
        check(r.returncode != 0, f"{fault}: 'ckptctl delete' succeeded on a bad listing")
        check(re.search(words, r.stdout + r.stderr),
              f"{fault}: 'ckptctl delete' does not say /{words}/: {r.stdout}{r.stderr}")
        check(took < 10, f"{fault}: 'ckptctl delete' took {took:.1f} s")
        # two calls, each giving up after two pages: ckptctl's list (which looks
        # at the root, to name LATEST), then the delete
        lists = store.count(lambda m, k, q: m == "GET" and "list-type=2" in q)
        check(lists <= 4, f"{fault}: {lists} listing requests for one list and one delete")
        agent.alive(fault)
        check(committed_steps(store)[-2:] == [good - 1, good],
              f"{fault}: the committed steps are now {committed_steps(store)}")
    store.set_fault(None)


def scenario_dotdot(agent, store, good, tmp):
    """A listed key "step-1/../step-2/manifest.json" is a key: removing step 1 leaves step 2."""
    store.set_fault("list_dotdot")
    r = agent.ctl("delete", JOB, str(good - 1), timeout=30)
    check(r.returncode == 0, f"'ckptctl delete {JOB} {good - 1}': {r.stdout}{r.stderr}")
    store.set_fault(None)
    check(committed_steps(store) == [good], f"the committed steps are {committed_steps(store)}")
    r = agent.ctl("verify", JOB, str(good), timeout=60)
    check(r.returncode == 0, f"verify of step {good} after step {good - 1} went: {r.stdout}")
    agent.alive("dotdot")


def scenario_wrong_range(agent, store, good, tmp):
    """A 206 of other bytes than those asked for (its Content-Range honest about it)."""
    store.set_fault("wrong_range")
    r = agent.ctl("verify", JOB, str(good), timeout=60)
    check(r.returncode != 0, "verify passed on ranges the store shifted")
    check(re.search(r"asked for, the store sent \d+ bytes saying they are bytes",
                    r.stdout + r.stderr),
          f"verify does not say the store sent other bytes: {r.stdout}{r.stderr}")
    agent.alive("wrong range")
    store.set_fault(None)


def scenario_bad_etag(agent, store, good, tmp):
    """A part's ETag holding markup, which would be written into CompleteMultipartUpload."""
    store.set_fault("bad_etag")
    save_fails(agent, store, 107, good, r"no usable ETag", 20)
    check(not store.count(lambda m, k, q: m == "POST" and q.startswith("uploadId=")),
          "CompleteMultipartUpload was sent with a part's ETag of markup")
    left = uploads_left(store)
    check(not left, f"step 107: uploads left open: {left}")
    store.set_fault(None)


def scenario_uploads(agent, store, good, tmp):
    """ListMultipartUploads gone wrong, met by a second agent's clean-up at its start."""
    for fault, words in (("uploads_same_marker", r"the store gives the same markers again"),
                         ("uploads_no_marker", r"truncated without markers")):
        store.set_fault(fault)
        other = Agent(os.path.join(tmp, fault), agent.endpoint, node="h1")
        try:
            rc = other.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = None
        other.stop()
        other.log.close()
        check(rc is not None, f"{fault}: the second agent neither started nor gave up in 20 s")
        check(rc != 0, f"{fault}: the second agent started on a broken listing of uploads")
        check(re.search(words, other.log_tail()),
              f"{fault}: the second agent does not say /{words}/:\n{other.log_tail()}")
        n = store.count(lambda m, k, q: m == "GET" and "uploads=" in q)
        check(n <= 2, f"{fault}: {n} ListMultipartUploads requests for one listing")
        agent.alive(fault)
    store.set_fault(None)


def scenario_huge_get(agent, store, good, tmp):
    store.set_fault("huge_get")
    t0 = time.monotonic()
    r = agent.ctl("verify", JOB, str(good), timeout=60)
    took = time.monotonic() - t0
    check(r.returncode != 0, "verify passed on a manifest of 1 GiB")
    check(re.search(r"larger than|1073741824", r.stdout + r.stderr),
          f"verify does not say the reply is too large: {r.stdout}{r.stderr}")
    with store.mu:
        sent = store.sent_bytes
    # the agent refuses what Content-Length announces: it takes next to nothing
    check(sent < (16 << 20), f"the agent read {sent >> 20} MiB of a 1 GiB manifest first")
    check(took < 20, f"verify took {took:.1f} s")
    agent.alive("huge GET")
    store.set_fault(None)


def scenario_slowdown(agent, store, good, tmp):
    store.set_fault("slowdown")
    # whichever request meets it first (the root check, the plans, the shard's name)
    save_fails(agent, store, 104, good, r"HTTP 503.*after 2 tries", 20)
    with store.mu:
        reqs = list(store.requests)
    per = {}
    for m, k, q in reqs:  # the step's own requests are each made once per save
        if "step-000000000104" in k:
            per[(m, k, q)] = per.get((m, k, q), 0) + 1
    over = {r: n for r, n in per.items() if n > 2}
    check(not over, f"sent more than --s3-max-tries 2 times: {over}")
    store.set_fault(None)


def scenario_silent(agent, store, good, tmp):
    store.set_fault("silent")
    # two tries of 2 s without a byte, a back-off between: well under 20 s
    save_fails(agent, store, 105, good, r"[Tt]imeout|timed out", 20)
    store.release.set()
    store.set_fault(None)
    store.release.clear()


def single_writer(tmp):
    """Two agents on a store that ignores If-None-Match (see the top)."""
    store = Store()
    store.ignore_inm = True
    srv = serve(store)
    endpoint = f"http://127.0.0.1:{srv.server_address[1]}"
    agents = [Agent(os.path.join(tmp, f"w{i}"), endpoint, node=f"w{i}", access_key=f"w{i}")
              for i in range(2)]
    manifest_puts = lambda who, step: [
        1 for w, m, k in store.who
        if w == who and m == "PUT" and k.endswith(f"step-{step:012d}/manifest.json")]

    def save_both(step, seconds):
        out = [None, None]
        ts = [threading.Thread(target=lambda r=r: out.__setitem__(
            r, agents[r].save(step, seconds, rank=r, world=2))) for r in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    try:
        for a in agents:
            a.wait_ready()
            r = a.ctl("status")
            check("one writer (rank 0's node)" in r.stdout,
                  f"{a.sock}: status does not say one writer:\n{r.stdout}")
        out = save_both(1, 40)
        check(all(o[0] == 0 for o in out), f"step 1 on that store: {out}")
        check(manifest_puts("w1", 1) == [] and len(manifest_puts("w0", 1)) == 1,
              f"step 1's manifest: w0 put it {len(manifest_puts('w0', 1))} times, "
              f"w1 {len(manifest_puts('w1', 1))}")
        # rank 0's node cannot put step 2's manifest: w1 must not take over
        store.set_fault("manifest_2_fails")
        out = save_both(2, 60)
        check(all(o[0] != 0 for o in out), f"step 2 committed without a manifest: {out}")
        check(manifest_puts("w0", 2) and not manifest_puts("w1", 2),
              f"step 2's manifest: w0 tried {len(manifest_puts('w0', 2))} puts, w1 "
              f"{len(manifest_puts('w1', 2))} (it must never take over)")
        check(2 not in committed_steps(store), "step 2 has a manifest")
        store.set_fault(None)
        r = agents[1].ctl("commit", "--finish", JOB, "2", timeout=30)
        check(r.returncode == 0, f"commit --finish by hand: {r.stdout}{r.stderr}")
        check(committed_steps(store) == [1, 2], f"committed {committed_steps(store)}")
        r = agents[0].ctl("verify", JOB, "2", timeout=60)
        check(r.returncode == 0, f"verify of step 2 committed by hand: {r.stdout}{r.stderr}")
    except Failed as e:
        raise Failed(f"{e}\nw0's log:\n{agents[0].log_tail()}\nw1's log:\n{agents[1].log_tail()}")
    finally:
        store.release.set()
        for a in agents:
            a.stop()
            a.log.close()
        srv.shutdown()
        srv.server_close()


def run(tmp):
    store = Store()
    srv = serve(store)
    endpoint = f"http://127.0.0.1:{srv.server_address[1]}"
    agent = Agent(os.path.join(tmp, "h0"), endpoint)
    agent.endpoint = endpoint
    try:
        agent.wait_ready()
        # start-up: HEAD of the bucket, the probe put twice (412 the second time), deleted
        probes = [k for m, k, q in store.requests if m == "PUT" and "/.ckptd/probe." in k]
        check(len(probes) == 2 and probes[0] == probes[1],
              f"start-up probe PUTs: {probes}")
        check(not [k for k in store.keys() if "probe" in k], "the probe key was left behind")

        t0 = time.monotonic()
        for step in (1, 2):
            rc, err, _ = agent.save(step)
            check(rc == 0, f"step {step} on a store that behaves: {err}\n{agent.log_tail()}")
        check(committed_steps(store) == [1, 2] and latest(store) == 2,
              f"committed {committed_steps(store)}, LATEST {latest(store)}")
        check(store.count(lambda m, k, q: m == "POST" and q == "uploads=") >= 2,
              "the shards were not multipart uploads")
        r = agent.ctl("verify", JOB, "2", timeout=60)
        check(r.returncode == 0, f"verify of step 2: {r.stdout}{r.stderr}")
        print(f"ok: two steps saved and verified on the fake store "
              f"({time.monotonic() - t0:.1f} s)")
        good = 2
        for sc in (scenario_no_upload_id, scenario_complete_error, scenario_head_wrong_size,
                   scenario_bad_etag, scenario_listings, scenario_dotdot, scenario_uploads,
                   scenario_huge_get, scenario_wrong_range, scenario_slowdown, scenario_silent):
            t0 = time.monotonic()
            sc(agent, store, good, tmp)
            print(f"ok: {sc.__name__[len('scenario_'):]} ({time.monotonic() - t0:.1f} s)")
        store.set_fault(None)
        rc, err, _ = agent.save(3)
        check(rc == 0, f"step 3 once the store behaves again: {err}")
        check(latest(store) == 3, f"LATEST is {latest(store)} after step 3")
        r = agent.ctl("verify", JOB, "3", timeout=60)
        check(r.returncode == 0, f"verify of step 3: {r.stdout}{r.stderr}")
        print("ok: the store behaves again, step 3 commits and verifies")

        # a store that throttles (429 to each request the first time): tried again, it commits
        store.set_fault("throttle")
        rc, err, _ = agent.save(4)
        check(rc == 0, f"step 4 on a store that answers 429 once to each request: {err}")
        check(latest(store) == 4, f"LATEST is {latest(store)} after step 4")
        r = agent.ctl("verify", JOB, "4", timeout=60)
        check(r.returncode == 0, f"verify of step 4 through the 429s: {r.stdout}{r.stderr}")
        with store.mu:
            refused = len(store.throttled)
        check(refused > 0, "the store never answered 429")
        store.set_fault(None)
        print(f"ok: {refused} requests answered 429 once, each tried again: step 4 commits "
              f"and verifies")

        # the stop, while a request is held unanswered
        store.set_fault("silent_shards")
        saver = threading.Thread(target=agent.save, args=(106,), daemon=True)
        saver.start()
        deadline = time.monotonic() + 10
        while not store.count(lambda m, k, q: k.endswith(".safetensors")) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        status = agent.stop(seconds=20)
        took = time.monotonic() - t0
        check(status is not None, "ckptd did not stop within 20 s of SIGTERM")
        check(status == 0, f"ckptd exited with {status}:\n{agent.log_tail()}")
        check(took < 12, f"ckptd took {took:.1f} s to stop with a request unanswered")
        print(f"ok: stopped in {took:.1f} s with a request unanswered")
        check(106 not in committed_steps(store), "step 106 was committed")
        t0 = time.monotonic()
        single_writer(tmp)
        print(f"ok: a store that ignores If-None-Match: one writer, no takeover "
              f"({time.monotonic() - t0:.1f} s)")
        return 0
    except Failed as e:
        print(f"FAIL: {e}\nagent log:\n{agent.log_tail()}")
        return 1
    finally:
        store.release.set()
        agent.stop()
        agent.log.close()
        srv.shutdown()
        srv.server_close()


def main():
    for v in ("CKPTD_BIN", "CKPTCTL_BIN", "CKPT_FIXTURE_BIN"):
        if not os.environ.get(v):
            skip(f"{v} is not set (run this through ctest)")
        if not os.access(os.environ[v], os.X_OK):
            skip(f"{v}={os.environ[v]} is not an executable")
    tmp = tempfile.mkdtemp(prefix="cks3h.", dir=os.environ.get("CK_TMPDIR"))
    try:
        return run(tmp)
    finally:
        if not os.environ.get("CKPT_TEST_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
