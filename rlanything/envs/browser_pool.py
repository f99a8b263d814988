"""Headless Chromium browsers for web environments: launched once, reused, killed when stuck.

A `Browser` is one ChromeDriver + Chromium pair in its own process group, driven through
Selenium; the group is killed when this process ends, however it ends (`rlanything.procs`).
Every call into it runs with a wall-clock timeout: a call that hangs or fails gets the whole
process group killed and raises `BrowserFailure`, so a broken browser costs one
episode (recorded as `env_error` by the rollout loop), never a hung iteration.

A `BrowserPool` holds at most `size` browsers per process and lends them per call
(`with pool.lease(owner) as browser`): launching costs seconds, a reset costs milliseconds,
so browsers are reused across episodes and tasks rather than relaunched. Each browser remembers
which episode (`owner`) its page state belongs to; the pool hands an episode back the browser
that still holds its state when it can, and otherwise the least recently used idle one (the
environment then rebuilds its state by replaying its actions, see `envs/miniwob.py`). With
`size` >= the number of episodes alive at once, no state is ever rebuilt.

Offline by construction: Selenium Manager is switched off (`SE_OFFLINE`, `SE_AVOID_STATS`,
explicit driver and browser paths) and Chromium runs with background networking, component
updates and DNS disabled; pages are local `file://` URLs.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rlanything import procs

CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--metrics-recording-only",
    "--no-pings",
    "--mute-audio",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--window-size=500,400",
    "--force-device-scale-factor=1",
)


class BrowserFailure(RuntimeError):
    """The browser crashed, hung past its timeout or failed to start; it has been killed."""


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> Any:
    """fn() in a daemon thread; TimeoutError if it has not returned after `timeout_s`.

    A daemon thread, not an executor: a call stuck in a dead socket must never block exit."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True, name="browser-call")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"browser call still running after {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Browser:
    """One headless Chromium + ChromeDriver process group and its Selenium session."""

    def __init__(self, chromium: str, chromedriver: str, launch_timeout_s: float):
        self.chromium, self.chromedriver = chromium, chromedriver
        self.driver = None
        self.service = None
        self.owner: object | None = None  # the episode whose state the page holds
        self.owner_steps = 0  # how many of the owner's actions the page reflects
        self.last_used = 0.0
        self.alive = True
        started = time.perf_counter()
        try:
            call_with_timeout(self._launch, launch_timeout_s)
        except BaseException as err:
            self.kill()
            raise BrowserFailure(f"Chromium did not start: {type(err).__name__}: {err}") from err
        self.launch_s = time.perf_counter() - started

    def _launch(self) -> None:
        os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager reach the network
        os.environ.setdefault("SE_AVOID_STATS", "true")
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = self.chromium
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)

        class GuardedService(Service):
            def _start_process(self, path: str) -> None:
                super()._start_process(path)
                procs.guard(self.process.pid, group=True)  # dies with this process, even on SIGKILL

        # Own process group: killing it takes ChromeDriver and every Chromium child along.
        self.service = GuardedService(self.chromedriver, popen_kw={"start_new_session": True})
        self.driver = webdriver.Chrome(service=self.service, options=options)
        if not self.alive:  # the launch outlived its timeout and was given up: leave nothing behind
            self.kill()

    @property
    def pgid(self) -> int | None:
        process = getattr(self.service, "process", None)
        return process.pid if process is not None else None

    def pids(self) -> list[int]:
        """ChromeDriver's pid first, then its Chromium processes, parents before children (Linux /proc).

        Tree order, not pid order: once pids wrap around, a renderer can have a lower pid than
        the Chromium main process that started it.
        """
        if self.pgid is None:
            return []
        members = set(procs.group_members(self.pgid))
        tree = [self.pgid, *procs.descendants(self.pgid)]
        return [p for p in tree if p in members] + sorted(members - set(tree))

    def run(self, fn: Callable[[Any], Any], timeout_s: float) -> Any:
        """fn(driver) under a timeout; any failure kills the browser and raises BrowserFailure."""
        if not self.alive:
            raise BrowserFailure("browser already dead")
        try:
            return call_with_timeout(lambda: fn(self.driver), timeout_s)
        except BaseException as err:
            self.kill()
            raise BrowserFailure(f"browser call failed: {type(err).__name__}: {str(err)[:300]}") from err

    def kill(self) -> None:
        """SIGKILL the process group (no graceful quit: the browser may be hung)."""
        self.alive = False
        if self.pgid is not None:
            procs.stop_popen(self.service.process, grace=0, signum=signal.SIGKILL)

    def quit(self, timeout_s: float = 10.0) -> None:
        if self.alive and self.driver is not None:
            try:
                call_with_timeout(self.driver.quit, timeout_s)
            except BaseException:
                pass
        self.kill()


class BrowserPool:
    """At most `size` browsers, lent per call; see the module docstring."""

    def __init__(self, size: int, chromium: str, chromedriver: str, launch_timeout_s: float = 60.0):
        self.size, self.chromium, self.chromedriver = size, chromium, chromedriver
        self.launch_timeout_s = launch_timeout_s
        self.browsers: list[Browser] = []
        self.launches = 0  # browsers started so far (restarts included)
        self._busy: set[int] = set()
        self._launching = 0
        self._cond = threading.Condition()

    def _pick(self, owner: object) -> Browser | None:
        idle = [b for b in self.browsers if id(b) not in self._busy]
        mine = [b for b in idle if b.owner is owner]
        free = [b for b in idle if b.owner is None]
        if mine or free:
            return (mine or free)[0]
        if len(self.browsers) + self._launching < self.size:
            return None  # launch a new one
        if idle:  # take over the least recently used episode's browser
            return min(idle, key=lambda b: b.last_used)
        return None

    @contextmanager
    def lease(self, owner: object) -> Iterator[Browser]:
        """A browser for one call; the one holding `owner`'s page state when there is one."""
        with self._cond:
            while True:
                self.browsers = [b for b in self.browsers if b.alive]
                browser = self._pick(owner)
                if browser is not None or len(self.browsers) + self._launching < self.size:
                    break
                self._cond.wait()
            if browser is None:
                self._launching += 1
            else:
                self._busy.add(id(browser))
        if browser is None:
            try:
                browser = Browser(self.chromium, self.chromedriver, self.launch_timeout_s)
            finally:
                with self._cond:
                    self._launching -= 1
                    self._cond.notify_all()
            with self._cond:
                self.launches += 1
                self.browsers.append(browser)
                self._busy.add(id(browser))
        try:
            yield browser
        finally:
            browser.last_used = time.monotonic()
            with self._cond:
                self._busy.discard(id(browser))
                if not browser.alive and browser in self.browsers:
                    self.browsers.remove(browser)
                self._cond.notify_all()

    def release(self, owner: object) -> None:
        """`owner`'s episode is over: its browser becomes free for anyone (the page stays)."""
        with self._cond:
            for browser in self.browsers:
                if browser.owner is owner:
                    browser.owner = None

    def shutdown(self) -> None:
        with self._cond:
            browsers, self.browsers = self.browsers, []
        for browser in browsers:
            browser.quit()


_POOLS: dict[tuple, BrowserPool] = {}
_POOLS_LOCK = threading.Lock()


def process_pool(size: int, chromium: str, chromedriver: str, launch_timeout_s: float) -> BrowserPool:
    """This process's pool for these browser binaries (a forked child gets its own); `size`
    follows the latest caller's config."""
    key = (os.getpid(), chromium, chromedriver)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = BrowserPool(size, chromium, chromedriver, launch_timeout_s)
        pool.size, pool.launch_timeout_s = size, launch_timeout_s
        return pool


@atexit.register
def shutdown_all() -> None:
    """Quit every browser this process started."""
    with _POOLS_LOCK:
        pools = [p for (pid, *_), p in _POOLS.items() if pid == os.getpid()]
    for pool in pools:
        pool.shutdown()
