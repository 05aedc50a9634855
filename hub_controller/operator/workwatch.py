"""The controller's ManifestWorks, followed by one lean list+watch of its own (not by kopf).

Every work the controller creates comes back to the hub process as a watch event: N events
during a fan-out over N clusters. Through kopf each event cost a per-object worker, the
indexing machinery, the diffbase kopf builds, handler bookkeeping; about 40 % of the hub's CPU
at N = 1,000 (docs/scale.md), taken from the apiserver on a small hub. Here one thread per
stream (`ocmfl.kube.list_watch`, label selector on the owner labels) keeps, per event, what
kopf's two work indexes kept: the work's `WorkState` by owner, and the owner by (cluster,
owner uid) for the aggregator's report scope; then it wakes the owner's reconcile loop.

Streams: one cluster-wide, or with `--namespace` one per listed namespace (a glob or `!`
pattern: one cluster-wide stream, filtered here). `synced` is set once every stream has
listed: before that the store is incomplete, and the reconcile loops wait for it (kopf waited
for its indexes the same way).
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import operator
import threading
from collections.abc import Callable, Iterable
from typing import Any, Final

from hub_controller.operator.observed import WorkState, work_state
from ocmfl import constants
from ocmfl.kube import LIST, Kube, Obj, list_watch, path_of

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name) of a FederatedLearning
OwnerKey = tuple[str, str]  # (cluster, owner uid)
SELECTOR: Final = f"{constants.LABEL_OWNER_NAME},{constants.LABEL_OWNER_NAMESPACE}"
WORK_API_VERSION: Final = f"{constants.WORK_GROUP}/v1"


def _owner(obj: Obj) -> tuple[Key, str] | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    ns = labels.get(constants.LABEL_OWNER_NAMESPACE)
    name = labels.get(constants.LABEL_OWNER_NAME)
    return ((ns, name), str(labels.get(constants.LABEL_OWNER_UID, ""))) if ns and name else None


class _View:
    """A read-only `get(key, default)` over one of the store's maps: a list copy, taken
    under the store's lock (the reconcile loops read from worker threads)."""

    def __init__(self, lock: threading.Lock, data: dict[Any, dict[str, Any]]) -> None:
        self._lock = lock
        self._data = data

    def get(self, key: Any, default: Any = None) -> Any:
        with self._lock:
            values = self._data.get(key)
            return list(values.values()) if values else default


class WorkStore:
    """ManifestWorks carrying the owner labels, by owner and by (cluster, owner uid)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # namespace/name -> (owner key, owner uid)
        self._objects: dict[str, tuple[Key, str]] = {}
        self._by_owner: dict[Key, dict[str, WorkState]] = {}
        self._by_cluster: dict[OwnerKey, dict[str, Key]] = {}
        self.works = _View(self._lock, self._by_owner)  # Key -> [WorkState]
        self.owners = _View(self._lock, self._by_cluster)  # (cluster, uid) -> [Key]
        self.synced = threading.Event()
        self.on_change: Callable[[Key], None] = lambda key: None
        self._on_synced: list[Callable[[], None]] = []
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.pending: set[str] = set()  # the streams that have not listed yet (their paths)

    # --- state (pure bookkeeping; the tests drive these directly) --------------------------
    def _drop(self, object_key: str) -> Key | None:
        entry = self._objects.pop(object_key, None)
        if entry is None:
            return None
        key, uid = entry
        ns = object_key.split("/", 1)[0]
        for data, k in ((self._by_owner, key), (self._by_cluster, (ns, uid))):
            bucket = data.get(k)
            if bucket is not None:
                bucket.pop(object_key, None)
                if not bucket:
                    del data[k]
        return key

    def _put(self, obj: Obj) -> Key | None:
        meta = obj["metadata"]
        object_key = f"{meta.get('namespace', '')}/{meta['name']}"
        old = self._drop(object_key)
        owner = _owner(obj)
        if owner is None:
            return old
        key, uid = owner
        self._objects[object_key] = owner
        self._by_owner.setdefault(key, {})[object_key] = work_state(obj)
        if uid:
            self._by_cluster.setdefault((meta.get("namespace", ""), uid), {})[object_key] = key
        return key

    def event(self, etype: str, obj: Obj) -> None:
        """One watch event (ADDED, MODIFIED, DELETED): the store, then the owner's wake-up."""
        with self._lock:
            if etype == "DELETED":
                meta = obj["metadata"]
                key = self._drop(f"{meta.get('namespace', '')}/{meta['name']}")
            else:
                key = self._put(obj)
        if key is not None:
            self.on_change(key)

    def listed(self, items: Iterable[Obj], in_stream: Callable[[str], bool]) -> None:
        """A stream's (re)list: its namespaces' works are now `items`; every owner whose works
        changed is woken."""
        with self._lock:
            before = {k: v for k, v in self._objects.items() if in_stream(k.split("/", 1)[0])}
            for object_key in before:
                self._drop(object_key)
            keys = {key for key, _ in before.values()}
            for obj in items:
                if not in_stream(str((obj.get("metadata") or {}).get("namespace", ""))):
                    continue
                key = self._put(obj)
                if key is not None:
                    keys.add(key)
        for key in keys:
            self.on_change(key)

    def when_synced(self, callback: Callable[[], None]) -> None:
        """Call `callback` once every stream has listed (now, if that happened already)."""
        with self._lock:
            if not self.synced.is_set():
                self._on_synced.append(callback)
                return
        callback()

    def _mark_synced(self) -> None:
        with self._lock:
            callbacks, self._on_synced = self._on_synced, []
            self.synced.set()
        for callback in callbacks:
            callback()

    # --- the streams -----------------------------------------------------------------------
    def start(self, kube: Kube, namespaces: Iterable[str] = ()) -> None:
        """Start the streams (see the module docstring) on `kube` (a client of their own:
        each stream holds one connection open)."""
        patterns = [n for n in namespaces if n]
        exact = all(not any(c in p for c in "*?[!") for p in patterns)
        streams: list[tuple[str, Callable[[str], bool]]]
        if not patterns:
            streams = [(path_of(WORK_API_VERSION, "ManifestWork"), lambda ns: True)]
        elif exact:
            streams = [
                (path_of(WORK_API_VERSION, "ManifestWork", p), functools.partial(operator.eq, p))
                for p in sorted(set(patterns))
            ]
        else:
            streams = [(path_of(WORK_API_VERSION, "ManifestWork"), _matcher(patterns))]
        pending = self.pending
        pending.update(path for path, _ in streams)
        pending_lock = threading.Lock()

        def follow(path: str, in_stream: Callable[[str], bool]) -> None:
            query = {"labelSelector": SELECTOR}
            for etype, obj in list_watch(kube, path, stop=self.stop, query=query):
                if self.stop.is_set():
                    return
                if etype == LIST:
                    self.listed(obj.get("items") or [], in_stream)
                    with pending_lock:
                        pending.discard(path)
                        last = not pending and not self.synced.is_set()
                    if last:
                        self._mark_synced()
                elif in_stream(str((obj.get("metadata") or {}).get("namespace", ""))):
                    self.event(etype, obj)

        def keep_following(path: str, in_stream: Callable[[str], bool]) -> None:
            # A stream that died on an unexpected error would leave every resource's first
            # pass waiting for `synced` without a word: say it, and follow again.
            while not self.stop.is_set():
                try:
                    follow(path, in_stream)
                except Exception:
                    log.exception("ManifestWork stream %s failed; following it again", path)
                    self.stop.wait(1.0)

        for path, in_stream in streams:
            thread = threading.Thread(
                target=keep_following, args=(path, in_stream), name="ocmfl-works", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def close(self) -> None:
        """Stop the streams (their threads end at their next event or timeout)."""
        self.stop.set()


def _matcher(patterns: list[str]) -> Callable[[str], bool]:
    """kopf's namespace patterns: globs, `!glob` excludes; no positive pattern = all."""
    include = [p for p in patterns if not p.startswith("!")]
    exclude = [p[1:] for p in patterns if p.startswith("!")]

    def matches(ns: str) -> bool:
        if any(fnmatch.fnmatchcase(ns, p) for p in exclude):
            return False
        return not include or any(fnmatch.fnmatchcase(ns, p) for p in include)

    return matches
