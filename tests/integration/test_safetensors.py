"""Every shard ckptd writes is a safetensors file the real library loads.

Starts ckptd in a temporary directory, has ckpt_fixture (one trainer rank,
every dtype, odd shapes, a few MiB) save a 1-rank job and a 2-rank job with a
sharded tensor, then reads each shard back outside ckptd:

  (a) with the safetensors library (PyPI), comparing every tensor's dtype,
      shape and bytes with the pattern the fixture wrote;
  (b) by parsing the header here, checking the layout (data aligned to 8, the
      file ending at the last tensor) and that it agrees with manifest.json;
  (c) for the 2-rank job, that the manifest's chunks of the sharded tensor
      tile its global shape, and that joined they hold the global pattern.

Environment: CKPTD_BIN, CKPTCTL_BIN, CKPT_FIXTURE_BIN (set by CMake);
CK_TMPDIR, where the temporary directory goes; CKPT_TEST_KEEP, keep it.
Exit 0: passed; 1: failed (each mismatch printed); 77: safetensors or numpy
is missing from this Python (skipped).
"""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

from agentproc import Agent

try:
    import numpy as np
    import safetensors
    from safetensors import safe_open
except ImportError as exc:
    print(f"skipped: {sys.executable} cannot import safetensors and numpy ({exc}); "
          "create a venv with: python3 -m venv .venv && "
          ".venv/bin/pip install safetensors numpy")
    sys.exit(77)

SEED_ONE_RANK = 1234567
SEED_TWO_RANKS = 987654321
STEP = 42

# numpy dtypes for what numpy has; BF16 and the F8 types it lacks.
NUMPY_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
    "U16": np.uint16, "F16": np.float16, "I32": np.int32, "U32": np.uint32,
    "F32": np.float32, "F64": np.float64, "I64": np.int64, "U64": np.uint64,
}
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2,
    "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8,
    "I64": 8, "U64": 8,
}

MASK64 = (1 << 64) - 1


class Failures:
    """Collects mismatches: (file, tensor, what, expected, got)."""

    def __init__(self):
        self.items = []

    def add(self, path, tensor, what, expected, got):
        self.items.append((path, tensor, what, expected, got))

    def check(self, cond, path, tensor, what, expected, got):
        if not cond:
            self.add(path, tensor, what, expected, got)
        return cond

    def report(self):
        for path, tensor, what, expected, got in self.items[:100]:
            print(f"FAIL {path}: tensor {tensor!r}: {what}: expected {expected!r}, "
                  f"got {got!r}")
        if len(self.items) > 100:
            print(f"... and {len(self.items) - 100} more")


def mix(x):
    """splitmix64's finalizer on an array of uint64 (wraps mod 2^64)."""
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xff51afd7ed558ccd)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xc4ceb9fe1a85ec53)
    return x ^ (x >> np.uint64(33))


def pattern(seed, index, offset, nbytes):
    """Bytes offset..offset+nbytes of byte(seed, i, j), as ckpt_fixture.c writes them.

    byte(seed, i, j) = mix(seed*K + i*P + j/8) >> ((j%8)*8): byte j%8 of the
    little-endian 64-bit word j/8.
    """
    if nbytes == 0:
        return b""
    base = (seed * 0x9e3779b97f4a7c15 + index * 0x100000001b3) & MASK64
    first, last = offset // 8, (offset + nbytes - 1) // 8
    words = np.arange(first, last + 1, dtype=np.uint64) + np.uint64(base)
    raw = mix(words).astype("<u8").tobytes()
    start = offset - first * 8
    return raw[start:start + nbytes]


def expected_bytes(seed, t):
    data = pattern(seed, t["index"], t["pattern_offset"], nbytes_of(t["dtype"], t["shape"]))
    if t["kind"] == "bool":
        data = bytes(b & 1 for b in data)
    return data


def nbytes_of(dtype, shape):
    n = DTYPE_SIZES[dtype]
    for d in shape:
        n *= d
    return n


def first_difference(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"byte {k}: 0x{x:02x} vs 0x{y:02x}"
    return f"lengths {len(a)} vs {len(b)}"


# ---- the agent and the fixture ---------------------------------------------

def run_fixtures(fixture, agent, job, seed, world):
    """Runs one fixture per rank at once; returns their reports, by rank."""
    procs = []
    for rank in range(world):
        cmd = [fixture, "--endpoint", agent.endpoint, "--job", job, "--step", str(STEP),
               "--seed", str(seed), "--rank", str(rank), "--world", str(world)]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    reports, errors = [], []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            errors.append(f"ckpt_fixture rank {rank} of job {job}: timed out after 300 s")
            continue
        if p.returncode != 0:
            errors.append(f"ckpt_fixture rank {rank} of job {job} exited with "
                          f"{p.returncode}: {err.decode(errors='replace').strip()}")
            continue
        try:
            reports.append(json.loads(out))
        except ValueError as exc:
            errors.append(f"ckpt_fixture rank {rank} of job {job}: stdout is not JSON "
                          f"({exc}): {out[:500]!r}")
    if errors:
        raise RuntimeError("\n".join(errors) + "\nagent log:\n" + agent.log_tail())
    return reports


# ---- (a) the safetensors library -------------------------------------------

def check_with_library(path, data, report, fails):
    """Loads the shard with safetensors and compares every tensor with the pattern.

    safetensors.numpy.load_file (and safe_open(...).get_tensor) turn tensors
    into numpy arrays, and numpy has no bfloat16 or float8 types: they raise
    TypeError/AttributeError for BF16 and F8_*. So:
      - safetensors.deserialize(bytes), the library's own Rust parser (it
        validates the header and the offsets against the buffer as load_file
        does), gives every tensor, all dtypes, as dtype name, shape and raw
        bytes: those are compared for every tensor;
      - safe_open(path, framework="np") is also opened: metadata(), keys(),
        and get_slice(name).get_dtype()/get_shape() for every tensor, and
        get_tensor(name) as a numpy array for the dtypes numpy has.
    """
    seed = report["seed"]
    expected = {t["name"]: t for t in report["tensors"]}
    try:
        loaded = dict(safetensors.deserialize(data))
    except Exception as exc:  # the library's own error type, or a TypeError
        fails.add(path, "*", "safetensors.deserialize", "a valid file", repr(exc))
        return
    fails.check(set(loaded) == set(expected), path, "*", "tensor names (deserialize)",
                sorted(expected), sorted(loaded))
    for name, t in expected.items():
        if name not in loaded:
            continue
        got = loaded[name]
        fails.check(got["dtype"] == t["dtype"], path, name, "dtype (deserialize)",
                    t["dtype"], got["dtype"])
        fails.check(list(got["shape"]) == t["shape"], path, name, "shape (deserialize)",
                    t["shape"], list(got["shape"]))
        want = expected_bytes(seed, t)
        have = bytes(got["data"])
        if have != want:
            fails.add(path, name, "bytes (deserialize)", f"{len(want)} bytes of the pattern",
                      first_difference(want, have))

    try:
        with safe_open(path, framework="np") as f:
            meta = f.metadata()
            fails.check(meta is not None and meta.get("format") == "pt", path, "__metadata__",
                        "format (safe_open)", "pt", meta)
            keys = list(f.keys())
            fails.check(set(keys) == set(expected), path, "*", "tensor names (safe_open)",
                        sorted(expected), sorted(keys))
            for name, t in expected.items():
                if name not in keys:
                    continue
                sl = f.get_slice(name)
                fails.check(sl.get_dtype() == t["dtype"], path, name, "dtype (get_slice)",
                            t["dtype"], sl.get_dtype())
                fails.check(list(sl.get_shape()) == t["shape"], path, name,
                            "shape (get_slice)", t["shape"], list(sl.get_shape()))
                if t["dtype"] not in NUMPY_DTYPES:
                    continue
                arr = f.get_tensor(name)
                want_dtype = np.dtype(NUMPY_DTYPES[t["dtype"]])
                fails.check(arr.dtype == want_dtype, path, name, "numpy dtype (get_tensor)",
                            str(want_dtype), str(arr.dtype))
                fails.check(list(arr.shape) == t["shape"], path, name,
                            "numpy shape (get_tensor)", t["shape"], list(arr.shape))
                want = expected_bytes(seed, t)
                have = arr.tobytes()  # raw bytes: float NaN payloads are kept
                if have != want:
                    fails.add(path, name, "bytes (get_tensor)",
                              f"{len(want)} bytes of the pattern", first_difference(want, have))
    except Exception as exc:
        fails.add(path, "*", "safe_open(framework='np')", "a loadable file", repr(exc))


# ---- (b) the header, by hand, against manifest.json -------------------------

def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dups = sorted({k for k in keys if keys.count(k) > 1})
    if dups:
        raise ValueError(f"keys given twice: {dups}")
    return dict(pairs)


def valid_entry(e):
    def uint(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    return (isinstance(e, dict) and set(e) == {"dtype", "shape", "data_offsets"}
            and e["dtype"] in DTYPE_SIZES
            and isinstance(e["shape"], list) and all(uint(d) for d in e["shape"])
            and isinstance(e["data_offsets"], list) and len(e["data_offsets"]) == 2
            and all(uint(o) for o in e["data_offsets"])
            and e["data_offsets"][0] <= e["data_offsets"][1])


def parse_header(path, data, fails):
    """Returns (data_start, {name: entry}) or None; checks the layout rules."""
    if not fails.check(len(data) >= 8, path, "*", "file size", ">= 8", len(data)):
        return None
    (n,) = struct.unpack("<Q", data[:8])
    if not fails.check(8 + n <= len(data), path, "*", "header length", f"<= {len(data) - 8}", n):
        return None
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    except ValueError as exc:
        fails.add(path, "*", "header JSON", "valid UTF-8 JSON, no duplicate keys", str(exc))
        return None
    data_start = 8 + n
    fails.check(data_start % 8 == 0, path, "*", "data start (8 + header length) % 8", 0,
                data_start % 8)
    meta = header.pop("__metadata__", None)
    if fails.check(isinstance(meta, dict), path, "__metadata__", "present, an object",
                   "an object", meta):
        fails.check(all(isinstance(v, str) for v in meta.values()), path, "__metadata__",
                    "values", "strings", meta)
        fails.check(meta.get("format") == "pt", path, "__metadata__", "format", "pt",
                    meta.get("format"))
    for name, e in list(header.items()):
        if not fails.check(valid_entry(e), path, name, "header entry",
                           "{dtype, shape: [ints >= 0], data_offsets: [b, e], b <= e}", e):
            del header[name]
    end = 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        b, f = e["data_offsets"]
        fails.check(b == end, path, name, "data_offsets begin (contiguous)", end, b)
        fails.check(f - b == nbytes_of(e["dtype"], e["shape"]), path, name,
                    "data_offsets length = dtype x shape",
                    nbytes_of(e["dtype"], e["shape"]), f - b)
        end = f
    fails.check(len(data) == data_start + end, path, "*", "file size = 8 + N + last offset",
                data_start + end, len(data))
    return data_start, header


def check_against_manifest(path, data, report, manifest, fails):
    parsed = parse_header(path, data, fails)
    if parsed is None:
        return
    data_start, header = parsed
    rank = report["rank"]
    expected = {t["name"]: t for t in report["tensors"]}
    # the header as the fixture described it
    for name, t in expected.items():
        e = header.get(name)
        if not fails.check(e is not None, path, name, "in the header", "present", "missing"):
            continue
        fails.check(e["dtype"] == t["dtype"], path, name, "header dtype", t["dtype"], e["dtype"])
        fails.check(e["shape"] == t["shape"], path, name, "header shape", t["shape"],
                    e["shape"])
    fails.check(set(header) == set(expected), path, "*", "header tensor names",
                sorted(expected), sorted(header))
    fails.check(len(data) == report["plan_bytes"], path, "*", "size = ckpt_plan_bytes",
                report["plan_bytes"], len(data))

    # this rank's entry in the manifest
    ranks = {k["rank"]: k for k in manifest["ranks"]}
    k = ranks.get(rank, {})
    fails.check(k.get("file") == os.path.basename(path), path, "*", "manifest ranks[].file",
                os.path.basename(path), k.get("file"))
    fails.check(k.get("size") == len(data), path, "*", "manifest ranks[].size", len(data),
                k.get("size"))
    fails.check(k.get("header_bytes") == data_start, path, "*",
                "manifest ranks[].header_bytes", data_start, k.get("header_bytes"))

    # every tensor of this shard has exactly one chunk of this rank, and it agrees
    tensors = manifest["tensors"]
    for name, e in header.items():
        mt = tensors.get(name)
        if not fails.check(mt is not None, path, name, "in manifest.json", "present",
                           "missing"):
            continue
        fails.check(mt["dtype"] == e["dtype"], path, name, "manifest dtype", e["dtype"],
                    mt["dtype"])
        chunks = [c for c in mt["chunks"] if c["rank"] == rank]
        if not fails.check(len(chunks) == 1, path, name, f"manifest chunks of rank {rank}", 1,
                           len(chunks)):
            continue
        c = chunks[0]
        fails.check(c["shape"] == e["shape"], path, name, "manifest chunk shape", e["shape"],
                    c["shape"])
        want_range = [data_start + e["data_offsets"][0], data_start + e["data_offsets"][1]]
        fails.check(c["byte_range"] == want_range, path, name,
                    "manifest byte_range = data start + data_offsets", want_range,
                    c["byte_range"])
        t = expected.get(name, {})
        if "global_shape" in t:
            fails.check(mt.get("sharded") is True, path, name, "manifest sharded", True,
                        mt.get("sharded"))
            fails.check(mt["global_shape"] == t["global_shape"], path, name,
                        "manifest global_shape", t["global_shape"], mt["global_shape"])
            fails.check(c.get("global_offset") == t["global_offset"], path, name,
                        "manifest chunk global_offset", t["global_offset"],
                        c.get("global_offset"))
        else:
            fails.check(not mt.get("sharded"), path, name, "manifest sharded", False,
                        mt.get("sharded"))
            fails.check(mt["global_shape"] == e["shape"], path, name,
                        "manifest global_shape (unsharded)", e["shape"], mt["global_shape"])
            fails.check(len(mt["chunks"]) == 1, path, name, "manifest chunks (unsharded)", 1,
                        len(mt["chunks"]))
    # and no chunk of this rank names a tensor the shard lacks
    for name, mt in tensors.items():
        if any(c["rank"] == rank for c in mt["chunks"]):
            fails.check(name in header, path, name, "manifest chunk's tensor in the shard",
                        "present", "missing")


# ---- (c) the sharded tensor across ranks -----------------------------------

def check_sharded(step_dir, reports, manifest, shards, fails):
    """The sharded tensor's chunks tile its global shape and join into its pattern."""
    mpath = os.path.join(step_dir, "manifest.json")
    sharded = {}
    for r in reports:
        for t in r["tensors"]:
            if "global_shape" in t:
                sharded[t["name"]] = t
    fails.check(len(sharded) == 1, mpath, "*", "sharded tensors reported by the fixture", 1,
                len(sharded))
    for name, t in sharded.items():
        mt = manifest["tensors"].get(name)
        if not fails.check(mt is not None, mpath, name, "in manifest.json", "present",
                           "missing"):
            continue
        gshape = mt["global_shape"]
        fails.check(gshape == t["global_shape"], mpath, name, "global_shape",
                    t["global_shape"], gshape)
        chunks = mt["chunks"]
        if not fails.check(len(chunks) == len(reports), mpath, name, "chunks",
                           len(reports), len(chunks)):
            continue
        fails.check(sorted(c["rank"] for c in chunks) == list(range(len(reports))), mpath,
                    name, "chunk ranks", list(range(len(reports))),
                    sorted(c["rank"] for c in chunks))
        # each box inside the global shape, no two overlapping, volumes summing to it
        boxes = []
        for c in chunks:
            off, shape = c.get("global_offset"), c["shape"]
            ok = off is not None and len(off) == len(gshape) == len(shape) and all(
                0 <= o and o + s <= g for o, s, g in zip(off, shape, gshape))
            if fails.check(ok, mpath, name, f"rank {c['rank']} chunk inside {gshape}",
                           "inside", {"global_offset": off, "shape": shape}):
                boxes.append((c["rank"], off, shape))
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                (ra, oa, sa), (rb, ob, sb) = boxes[i], boxes[j]
                overlap = all(max(a, b) < min(a + x, b + y)
                              for a, x, b, y in zip(oa, sa, ob, sb))
                fails.check(not overlap, mpath, name, f"chunks of ranks {ra} and {rb}",
                            "disjoint", {"a": [oa, sa], "b": [ob, sb]})
        volume = sum(int(np.prod(s, dtype=np.int64)) for _, _, s in boxes)
        fails.check(volume == int(np.prod(gshape, dtype=np.int64)), mpath, name,
                    "chunk volumes sum to the global volume",
                    int(np.prod(gshape, dtype=np.int64)), volume)
        # joined in place, the chunks (read by the library) are the global pattern
        size = DTYPE_SIZES[mt["dtype"]]
        whole = np.zeros(list(gshape) + [size], dtype=np.uint8)
        for rank, off, shape in boxes:
            data = shards.get(rank, {}).get(name)
            if data is None:
                continue
            box = tuple(slice(o, o + s) for o, s in zip(off, shape))
            whole[box] = np.frombuffer(data, dtype=np.uint8).reshape(list(shape) + [size])
        want = pattern(reports[0]["seed"], t["index"], 0, whole.size)
        have = whole.tobytes()
        if have != want:
            fails.add(mpath, name, "global tensor joined from the shards",
                      "the global pattern", first_difference(want, have))


# ---- driver ----------------------------------------------------------------

def check_coverage(job, reports, fails):
    """The fixture still saves what this test is meant to cover."""
    tensors = [t for r in reports for t in r["tensors"]]
    sizes = [nbytes_of(t["dtype"], t["shape"]) for t in tensors]
    ndims = {len(t["shape"]) for t in tensors}
    want = {
        "every safetensors dtype": set(DTYPE_SIZES) <= {t["dtype"] for t in tensors},
        "a 0-d scalar": 0 in ndims,
        "an empty tensor": any(0 in t["shape"] for t in tensors),
        "1-d, 2-d and 3-d shapes": {1, 2, 3} <= ndims,
        "sizes not multiples of 4096": all(n % 4096 for n in sizes if n),
        "a tensor of over 2 MiB (several 1 MiB chunks)": max(sizes) > 2 << 20,
        "a sharded tensor (world > 1)": len(reports) == 1 or any(
            "global_shape" in t for t in tensors),
    }
    for what, ok in want.items():
        fails.check(ok, f"ckpt_fixture (job {job})", "*", "covers", what, "not covered")


def check_job(agent, job, seed, reports, fails):
    step_dir = os.path.join(agent.root, job, f"step-{STEP:012d}")
    mpath = os.path.join(step_dir, "manifest.json")
    try:
        with open(mpath, "rb") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        fails.add(mpath, "*", "manifest.json", "a readable JSON file", str(exc))
        return
    world = len(reports)
    for key, want in (("job", job), ("step", STEP), ("world", world), ("meta", {"seed": seed})):
        fails.check(manifest.get(key) == want, mpath, "*", f"manifest {key}", want,
                    manifest.get(key))
    fails.check(len(manifest.get("ranks", [])) == world, mpath, "*", "manifest ranks", world,
                len(manifest.get("ranks", [])))
    files = {k.get("rank"): k.get("file") for k in manifest.get("ranks", [])
             if isinstance(k, dict)}
    for k in manifest.get("ranks", []):
        fails.check(k.get("meta") == {"seed": seed}, mpath, "*",
                    f"rank {k.get('rank')}'s own meta", {"seed": seed}, k.get("meta"))
    shards = {}
    for report in reports:
        # readers follow the manifest: shard names carry the node and an attempt
        name = files.get(report["rank"])
        if not fails.check(isinstance(name, str) and name.startswith(
                f"rank-{report['rank']:05d}.") and name.endswith(".safetensors"),
                mpath, "*", f"rank {report['rank']}'s file", "rank-NNNNN.<node>.<n>.safetensors",
                name):
            continue
        path = os.path.join(step_dir, name)
        with open(path, "rb") as f:
            data = f.read()
        check_with_library(path, data, report, fails)
        try:
            check_against_manifest(path, data, report, manifest, fails)
        except (KeyError, TypeError, AttributeError) as exc:
            fails.add(path, "*", "manifest.json entries for this shard",
                      "the fields manifest.c writes", repr(exc))
        try:
            shards[report["rank"]] = {n: bytes(t["data"])
                                      for n, t in safetensors.deserialize(data)}
        except Exception:
            pass  # already reported by check_with_library
    if world > 1:
        try:
            check_sharded(step_dir, reports, manifest, shards, fails)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            fails.add(mpath, "*", "manifest.json chunks of the sharded tensor",
                      "the fields manifest.c writes", repr(exc))


def main():
    bins = {}
    for var in ("CKPTD_BIN", "CKPTCTL_BIN", "CKPT_FIXTURE_BIN"):
        bins[var] = os.environ.get(var, "")
        if not os.access(bins[var], os.X_OK):
            print(f"FAIL: {var}={bins[var]!r} is not an executable "
                  "(ctest sets it; by hand, point it at the build's binary)")
            return 1
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}, "
          f"Python {sys.version.split()[0]}")

    # ctest's timeout, or a person's ^C: still stop ckptd and remove the directory
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))
    tmp = tempfile.mkdtemp(prefix="ckst.", dir=os.environ.get("CK_TMPDIR") or None)
    agent = None
    fails = Failures()
    try:
        agent = Agent(bins["CKPTD_BIN"], bins["CKPTCTL_BIN"], tmp)
        agent.wait_ready()
        jobs = (("st1", SEED_ONE_RANK, 1), ("st2", SEED_TWO_RANKS, 2))
        for job, seed, world in jobs:
            reports = run_fixtures(bins["CKPT_FIXTURE_BIN"], agent, job, seed, world)
            ntensors = sum(len(r["tensors"]) for r in reports)
            before = len(fails.items)
            check_coverage(job, reports, fails)
            check_job(agent, job, seed, reports, fails)
            print(f"job {job}: {world} rank(s), {ntensors} tensors checked, "
                  f"{len(fails.items) - before} mismatches")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        fails.add(tmp, "*", "running the agent and the fixture", "success", str(exc))
    finally:
        if agent is not None:
            rc = agent.stop()
            fails.check(rc == 0, agent.log_path, "*", "ckptd exit status at SIGTERM", 0, rc)
            if rc != 0:
                print(agent.log_tail())
        if os.environ.get("CKPT_TEST_KEEP"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if fails.items:
        fails.report()
        return 1
    print("ok: every shard loads in safetensors, holds what was saved, and matches "
          "manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
