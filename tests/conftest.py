import os
import random
import shutil
import sys
import tempfile
import zlib

import pytest
import torch
from gpu_order import spread_long_gpu_tests

# Without a GPU, Triton kernels run through its interpreter. This must be set before any module
# defines a @triton.jit function: a kernel defined before it is a compiled-mode kernel for good,
# and an interpreted kernel cannot call it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Triton's argument binder imports Gluon's modules the first time it runs: under the interpreter, inside the
    # process's first interpreted launch, while the interpreter has triton.language patched. Gluon's language then
    # forwards the interpreter's builtins (gl.reduce, gl.maximum, ...) for good, and a Gluon compile later in the
    # process fails (a gl.reduce with a @gluon.jit combine: "Did you forget to add @triton.gluon.jit ?"; the sm_90
    # compile checks of tests/kernels/test_wg.py after any interpreted unpack in the same xdist worker). Imported
    # here, before any launch: test_interp.py checks that gl's builtins are triton.language's own.
    try:
        import triton.experimental.gluon.nvidia.hopper  # noqa: F401  (and with it triton.experimental.gluon.language)
    except ImportError:  # no Triton, or one without Gluon: nothing to import early
        pass

# Every run compiles into a new, empty Triton cache: a warm cache skips the compile path, and once
# hid 49 failing compile checks that failed on a fresh machine. Removed when the session ends. pytest-xdist's
# workers share their controller's (it exports the folder before starting them), so a kernel is built once a run,
# by the worker that needs it first: with a cache each, the GPU set's 16 workers built the same kernels 16 times.
_SHARED_CACHE = os.environ.get("GLYD_TEST_TRITON_CACHE", "") if os.environ.get("PYTEST_XDIST_WORKER") else ""
_OWN_CACHE = not os.path.isdir(_SHARED_CACHE)
_TRITON_CACHE = tempfile.mkdtemp(prefix="glyd-test-triton-cache-") if _OWN_CACHE else _SHARED_CACHE
os.environ["TRITON_CACHE_DIR"] = os.environ["GLYD_TEST_TRITON_CACHE"] = _TRITON_CACHE


def pytest_addoption(parser):
    parser.addoption(
        "--glyd-order", default="", metavar="reverse|shuffle[:SEED]",
        help="run the collected tests in reverse or shuffled order (tests must pass in any order)",
    )


def _gpu_sample(items):
    """``@pytest.mark.gpu_sample(every=N)`` on a large GPU grid: one case in N (chosen by a hash of
    its id, so spread over every parameter) stays in the default GPU set (``-m "gpu and not slow"``,
    one device call); the others are marked slow (``-m "gpu and slow"`` runs them).
    ``cpu_sample(every=N)`` does the same for the cases that are not GPU ones (Triton's
    interpreter on the CPU), so the default CPU run stays within CI's time."""
    for item in items:
        gpu = "gpu" in item.keywords
        mark = item.get_closest_marker("gpu_sample" if gpu else "cpu_sample")
        if mark is None:
            continue
        every = mark.kwargs.get("every", mark.args[0] if mark.args else 1)
        if zlib.crc32(item.nodeid.encode()) % every:
            item.add_marker(pytest.mark.slow)


class _SpreadAfterSelection:
    @pytest.hookimpl(trylast=True)  # after -m and -k have deselected: spread among the tests that run
    def pytest_collection_modifyitems(self, config, items):
        if torch.cuda.is_available() and not config.getoption("--glyd-order"):
            spread_long_gpu_tests(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def pytest_configure(config):
    config.pluginmanager.register(_SpreadAfterSelection(), "glyd-spread-long-gpu-tests")
    picked = getattr(config, "workerinput", {}).get("glyd_order")  # a pytest-xdist worker: the controller's order
    if picked is not None:
        config.option.glyd_order = picked
    elif config.getoption("--glyd-order") == "shuffle":  # the seed chosen once, here: workers must collect alike
        config.option.glyd_order = f"shuffle:{random.randrange(1 << 30)}"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    # pytest-xdist (controller): each worker re-reads the command line, so it is handed the order chosen above
    node.workerinput["glyd_order"] = node.config.getoption("--glyd-order")


@pytest.hookimpl(tryfirst=True)  # before -m selects: the marks added here count
def pytest_collection_modifyitems(config, items):
    _gpu_sample(items)
    order = config.getoption("--glyd-order")
    if order == "reverse":
        items.reverse()
    elif order.startswith("shuffle"):
        seed = int(order.partition(":")[2] or random.randrange(1 << 30))
        random.Random(seed).shuffle(items)
    elif order:
        raise pytest.UsageError(f"--glyd-order must be reverse or shuffle[:SEED], got {order!r}")
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


try:  # the .glyd file codec needs zstandard (pinned for CI; absent on the lent GPU machine)
    import zstandard  # noqa: F401

    collect_ignore: list[str] = []
except ImportError:
    collect_ignore = ["filecodec"]


def pytest_report_header(config):
    lines = [f"triton cache: {_TRITON_CACHE} (new and empty)"]
    if collect_ignore:
        lines.append("zstandard is not installed: tests/filecodec are not collected")
    order = config.getoption("--glyd-order")
    seed = int(order.partition(":")[2]) if order.startswith("shuffle:") else None
    if seed is not None:
        lines.append(f"test order: shuffled with seed {seed} (--glyd-order shuffle:{seed} repeats it)")
    return lines


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:  # a worker leaves the shared cache to its controller
        shutil.rmtree(_TRITON_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_settings():
    """glyd reads its environment variables once (glyd._env): read them again around every test,
    so that a test's monkeypatched variables count and do not leak."""
    from glyd import _env

    _env.settings.cache_clear()
    yield
    _env.settings.cache_clear()


@pytest.fixture(autouse=True)
def _triton_language_untouched():
    """Fail a test that leaves ``triton.language`` patched (Triton's interpreter does, through a
    kernel not wrapped in ``glyd.kernels._interp.isolated``): later compiles in the process break."""
    if "triton.language" not in sys.modules:
        yield
        return
    from glyd.kernels._interp import language_namespaces

    spaces = language_namespaces()
    before = [(obj, dict(vars(obj))) for obj in spaces]
    yield
    changed = []
    for obj, old in before:
        now = vars(obj)
        name = getattr(obj, "__name__", repr(obj))
        changed += [f"{name}.{k}" for k, v in old.items() if now.get(k) is not v]
        if isinstance(obj, type):  # (Python creates a class's __annotations__ when first asked)
            changed += [f"{name}.{k}" for k in now if k not in old and k != "__annotations__"]
    if changed:
        from glyd.kernels._interp import _restore

        _restore(before)
        pytest.fail(f"the test left triton.language patched: {', '.join(sorted(changed)[:6])}"
                    f"{f' and {len(changed) - 6} more' if len(changed) > 6 else ''}")


@pytest.fixture(scope="session")
def cpu_kernels(tmp_path_factory):
    """``glyd.kernels.fixed12.cpu`` with its C extension: the installed one (``pip install`` builds
    it), else built from ``setup.py`` into a temporary folder. Skips only where no C compiler is:
    a build that fails on a machine with one fails the test."""
    import importlib.util
    import shlex
    import subprocess
    import sysconfig
    from pathlib import Path

    from glyd.kernels.fixed12 import cpu as cpu_fixed12

    if cpu_fixed12.available():
        return cpu_fixed12
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to build glyd's CPU kernels")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("glyd-cpu-ext")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(out), "--build-temp",
                        str(out / "tmp")], cwd=root, capture_output=True, text=True, timeout=600)
    built = sorted((out / "glyd" / "kernels" / "fixed12").glob("_cpu*.so"))
    assert r.returncode == 0 and built, f"building glyd's CPU kernels failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    spec = importlib.util.spec_from_file_location("glyd.kernels.fixed12._cpu", built[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["glyd.kernels.fixed12._cpu"] = module
    cpu_fixed12._ext.cache_clear()
    assert cpu_fixed12.available()
    return cpu_fixed12
