"""The Python package as a user installs it: `pip install ./client/python`
into a fresh virtual environment (pure Python: no compiler; pip fetches
the build backend, setuptools, from PyPI: skipped where it cannot),
then, from another directory, without the source tree on the path:
- with no libckpt anywhere, the first call raises ckpt.Error (ELIBACC)
  naming every place it looked;
- with libckpt.so.0 copied next to the installed package (and $CKPT_LIB
  unset), a save and a restore through a real agent, raw host memory (no
  numpy in that environment), byte for byte."""

import os
import shutil
import subprocess
import sys
import tempfile

from agentproc import Agent

USER = r'''
import ckpt, os, sys
assert ckpt.__file__.startswith(sys.prefix), ckpt.__file__
c = ckpt.Client(sys.argv[1])
mem = c.host_alloc(4096)
buf = mem.buffer()
buf[:] = bytes((i * 7 + 3) % 251 for i in range(4096))
saved = bytes(buf)
p = c.plan("pkg", 0, 1, [ckpt.Tensor("w", dtype="U8", shape=(4096,), address=mem.address)])
s = p.save(5, meta={"from": "the installed package"})
s.wait(ckpt.COMMITTED, 60000)
assert s.state == ckpt.COMMITTED, ckpt.state_name(s.state)
buf[:] = b"\0" * 4096
step, meta = p.restore(ckpt.LATEST)
assert step == 5 and meta == {"from": "the installed package"}, (step, meta)
assert bytes(buf) == saved
print("round trip ok")
'''

MISSING = r'''
import ckpt, errno
try:
    ckpt.Client("unix:/nonexistent/ckptd.sock")
except ckpt.Error as e:
    assert e.errno == errno.ELIBACC, e.errno
    print(e)
else:
    raise SystemExit("no error without libckpt")
'''


def run(cmd, env, cwd):
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise AssertionError(f"{cmd} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    tmp = tempfile.mkdtemp(prefix="ckpkg.", dir=os.environ.get("CK_TMPDIR"))
    venv, work = os.path.join(tmp, "venv"), os.path.join(tmp, "elsewhere")
    os.mkdir(work)
    env = {k: v for k, v in os.environ.items()
           if k not in ("CKPT_LIB", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")}
    agent = None
    try:
        base = getattr(sys, "_base_executable", sys.executable)
        r = subprocess.run([base, "-m", "venv", venv], capture_output=True, text=True)
        if r.returncode:
            print(f"skipped: cannot make a virtual environment: {r.stderr.strip()}")
            return 77
        py = os.path.join(venv, "bin", "python")
        # from a copy: setuptools builds in the tree it installs from
        src = os.path.join(tmp, "src")
        shutil.copytree(os.environ["CKPT_PY_DIR"], src,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", src],
                           env=env, cwd=work,
                           capture_output=True, text=True, timeout=300)
        if r.returncode and ("Could not find a version" in r.stderr or
                             "No matching distribution" in r.stderr):
            print(f"skipped: pip cannot fetch the build backend (no PyPI?):\n{r.stderr}")
            return 77
        assert r.returncode == 0, f"pip install exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        if b"libckpt" not in subprocess.run(["/sbin/ldconfig", "-p"],
                                            capture_output=True).stdout:
            out = run([py, "-c", MISSING], env, work)
            for words in ("cannot load libckpt", "$CKPT_LIB (not set)", "next to the package",
                          "the loader's path"):
                assert words in out, f"{words!r} not in: {out}"
        site = run([py, "-c", "import ckpt, os; print(os.path.dirname(ckpt.__file__))"],
                   env, work).strip()
        assert site.startswith(venv), site
        shutil.copy(os.environ["CKPT_LIB"], os.path.join(site, "libckpt.so.0"))
        agent = Agent(os.environ["CKPTD_BIN"], os.environ["CKPTCTL_BIN"], tmp)
        agent.wait_ready()
        out = run([py, "-c", USER, agent.endpoint], env, work)
        assert "round trip ok" in out, out
        print("ok: installed, found next to the package, saved and restored")
        return 0
    finally:
        if agent:
            agent.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
