"""Who imports whom, read from the source with ``ast`` (nothing is imported):

- the layers: ``tablets/`` (storage) never imports ``kafka_gateway`` (protocol)
  or ``txn`` (transaction coordinator); ``txn/`` never imports ``kafka_gateway``;
  ``common/`` imports none of them;
- the two engines: ``pgstore/`` (PostgreSQL) imports neither the protocol nor
  the coordinator, and of ``tablets/`` only the seam and its helpers
  (``PGSTORE_FROM_TABLETS``), which reach the RocksDB engine only by the
  imports listed in ``KNOWN_ENGINE_LEAKS``; ``tablets/`` never imports it;
- no import cycles among the modules of ``kafka_gateway/``, ``tablets/``,
  ``txn/``, ``bench/`` and ``common/``, but for the few listed in ``KNOWN_CYCLES``
  (owned by other work); an entry that no longer matches a cycle fails too, so
  breaking a cycle means deleting its entry.

Every import counts, also those under ``if TYPE_CHECKING:`` and inside functions:
a cycle through type hints or a deferred import is still two modules that cannot
be understood (or moved) one without the other. An edge goes to the module named,
not to the packages above it (``from a.b import c`` is an edge to ``a.b.c`` when
that is a module, else to ``a.b``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kafka_gateway", "tablets", "txn", "bench", "common", "pgstore")

# Cycles (strongly connected sets of modules) tolerated while other work breaks
# them. None is left: the tablet's parts name its settings in their own module
# (tablets/tablet_settings.py), not the tablet.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            out[".".join(parts)] = (path, is_package)
    return out


MODULES = _modules()


def _imports(module: str) -> set[str]:
    """The modules of MODULES that ``module`` imports (anywhere in its source)."""
    path, is_package = MODULES[module]
    here = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                if node.module:
                    base = f"{base}.{node.module}"
            else:
                base = node.module or ""
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: _imports(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected sets of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def _importers(layer: str, of: tuple[str, ...]) -> list[tuple[str, str]]:
    return sorted((module, target) for module, targets in GRAPH.items()
                  if module.split(".")[0] == layer
                  for target in targets if target.split(".")[0] in of)


def test_the_graph_is_read():
    # The premise: every package is found and its imports resolved, so an empty
    # answer below means no such import, not nothing read.
    assert {module.split(".")[0] for module in MODULES} == set(PACKAGES)
    assert "tablets.store" in GRAPH["tablets.engine"]
    assert "kafka_gateway.cli.common" in GRAPH["kafka_gateway.cli.topics"]  # relative
    assert "tablets.tablet_settings" in GRAPH["tablets.truncation"]  # under TYPE_CHECKING
    assert "kafka_gateway.server" in GRAPH["kafka_gateway.cli"]  # inside a function
    assert "pgstore.schema" in GRAPH["pgstore.migrate"]  # relative, in the new engine


def test_storage_never_imports_the_protocol_or_the_coordinator():
    assert _importers("tablets", ("kafka_gateway", "txn")) == []


def test_the_coordinator_never_imports_the_protocol():
    assert _importers("txn", ("kafka_gateway",)) == []


def test_common_imports_no_layer():
    assert _importers("common", ("kafka_gateway", "tablets", "txn", "bench", "pgstore")) == []


# What the PostgreSQL engine may use of tablets/: the seam and the values it
# names (its errors included), Kafka's record-batch format and checks (with
# the topic settings they read), and Kafka's rules kept engine-free behind a
# persistence port (producers, segments) or a reader port (compaction's planner).
PGSTORE_FROM_TABLETS = {
    "tablets.seam", "tablets.errors", "tablets.log_entry", "tablets.batch", "tablets.control",
    # The seam's parts, which tablets.seam re-exports (its one public entry).
    "tablets.seam_node", "tablets.seam_log", "tablets.seam_txn", "tablets.seam_offsets",
    "tablets.seam_stats",
    "tablets.offset_state", "tablets.important_holds", "tablets.topic_names",
    "tablets.records", "tablets.validate",
    "tablets.topic_config", "tablets.config_parsing",
    "tablets.tablet_settings", "tablets.compaction_config", "tablets.producer_rules",
    "tablets.segment_rules", "tablets.compaction", "tablets.encode",
    # Engine-free: the in-memory tail, and the node's budget shared over the read ones.
    "tablets.in_memory_batches", "tablets.tail_budget",
}
# Imports by which those reach the RocksDB engine (any module of tablets/ not
# listed above). None is left (docs/cluster-design.md, "Reused from
# tablets/"): StorageError moved from the store into errors.py, and
# CompactionConfig from the compaction run into compaction_config.py. A new
# entry would name an import to cut; one that no longer matches fails.
KNOWN_ENGINE_LEAKS: set[tuple[str, str]] = set()


def test_pgstore_imports_only_the_seam_and_its_helpers():
    assert _importers("pgstore", ("kafka_gateway", "txn", "bench")) == []
    beyond = [(module, target) for module, target in _importers("pgstore", ("tablets",))
              if target not in PGSTORE_FROM_TABLETS]
    assert beyond == [], "pgstore imports the RocksDB engine's modules"
    assert _importers("tablets", ("pgstore",)) == []


def test_pgstore_helpers_reach_the_rocksdb_engine_only_where_known():
    leaks = {(module, target) for module in PGSTORE_FROM_TABLETS for target in GRAPH[module]
             if target.startswith("tablets") and target not in PGSTORE_FROM_TABLETS}
    assert leaks == KNOWN_ENGINE_LEAKS


def test_no_import_cycles_but_the_known_ones():
    cycles = _cycles(GRAPH)
    new = [sorted(c) for c in cycles - KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    stale = [sorted(c) for c in KNOWN_CYCLES - cycles]
    assert not stale, f"KNOWN_CYCLES lists cycles that no longer exist; delete: {stale}"


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == {frozenset({"a", "b", "c"})}


# The storage seam (tablets/seam.py): above it, the protocol layer, the
# transaction coordinator, common/ and the benchmarks import only these modules
# of tablets/ -- the seam and the values it names, the errors, Kafka's topic
# config names and Kafka's record-batch format -- never the RocksDB engine's
# internals (tablets.store, tablets.keys, tablets.tablet, tablets.engine, ...).
SEAM_MODULES = {
    "tablets",  # the package: only SEAM_NAMES below
    "tablets.seam",
    "tablets.errors",
    "tablets.topic_config",
    "tablets.batch",
    "tablets.control",
}
# What the package itself may give: the RocksDB engine, built once by the
# server (its composition root), its settings, the offline opening of node
# records (the security CLI) and Kafka's topic name rules.
SEAM_NAMES = {"StorageEngine", "EngineSettings", "CleanerSettings", "open_node_records",
              "check_topic_name"}
ABOVE_THE_SEAM = ("kafka_gateway", "txn", "common", "bench")  # pgstore: its own rule


def _names_from_the_package(module: str) -> set[str]:
    """The names ``module`` imports with ``from tablets import ...`` (not modules)."""
    path, _ = MODULES[module]
    return {alias.name for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "tablets"
            for alias in node.names if f"tablets.{alias.name}" not in MODULES}


def test_above_the_seam_only_the_seam_is_imported():
    beyond = [(module, target) for layer in ABOVE_THE_SEAM
              for module, target in _importers(layer, ("tablets",))
              if target not in SEAM_MODULES]
    assert beyond == [], "imports past the storage seam (tablets/seam.py)"
    names = {(module, name) for module in MODULES if module.split(".")[0] in ABOVE_THE_SEAM
             for name in _names_from_the_package(module) - SEAM_NAMES}
    assert names == set(), "names from the tablets package past the seam"


# The modules declaring the seam by concern; tablets.seam re-exports them and
# is the one module anything else imports them through.
SEAM_PARTS = {"tablets.seam_node", "tablets.seam_log", "tablets.seam_txn",
              "tablets.seam_offsets", "tablets.seam_stats"}


def test_the_seam_parts_are_imported_only_through_the_seam():
    found = {m for m in MODULES if m.startswith("tablets.seam_")} - {"tablets.seam_check"}
    assert found == SEAM_PARTS, "a new part of the seam: list it here and in PGSTORE_FROM_TABLETS"
    assert GRAPH["tablets.seam"] >= SEAM_PARTS  # the premise: the entry's imports are read
    direct = sorted((module, target) for module, targets in GRAPH.items()
                    if module != "tablets.seam" and module not in SEAM_PARTS
                    for target in targets if target in SEAM_PARTS)
    assert direct == [], "import the seam's names from tablets.seam"


def test_the_seam_rule_sees_the_imports_it_forbids():
    # The premise: the rule reads the imports it judges. The coordinator does
    # import the seam, and a test helper (not above the seam) the store.
    assert "tablets.seam" in GRAPH["txn.coordinator"]
    assert "tablets.seam" in GRAPH["kafka_gateway.apis.fetch"]
    assert "StorageEngine" in _names_from_the_package("kafka_gateway.server")
    assert set(SEAM_MODULES) - {"tablets"} <= set(MODULES)
