"""The JVM side of the tests: jars resolved by Maven, Java programs compiled by javac.

    jars = classpath()                       # resolves once, then reuses the cache
    classes = compile_java(Path("compat_tests/jvm/src"))
    subprocess.run(java_command("ProduceConsume", "--bootstrap", ...), classes=classes)

Jars come from ``compat_tests/jvm/pom.xml`` through ``mvn
dependency:copy-dependencies`` into a cache outside git (``$KAFKA_GATEWAY_JVM_CACHE``,
default ``~/.cache/kafka-gateway/jvm``), keyed by the pom's hash so a changed pom
resolves again. Spark's Kafka connector has its own pom per PySpark line
(``SPARK_POM`` for Spark 4, ``SPARK35_POM`` for 3.5; ``spark_pom(version)``
picks the installed pyspark's), resolved the same way into its own directory;
spark_jobs finds it there.

Two lines of the Java client and Kafka Streams: 3.4.1 (``POM``, with the
reference broker) and 4.x (``KAFKA4_POM``). ``compile_java(pom=KAFKA4_POM)``
compiles the same sources against the 4.x jars; the classes directory records
which jars it was compiled with, so ``java_command(..., classes=...)`` runs a
program on its own line. A missing ``java``, ``javac`` or ``mvn`` is an error that says what
to install: these tests are never skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JVM_DIR = ROOT / "compat_tests" / "jvm"
POM = JVM_DIR / "pom.xml"
SPARK_POM = JVM_DIR / "spark" / "pom.xml"  # the default PySpark 4 line's connector
SPARK35_POM = JVM_DIR / "spark35" / "pom.xml"  # the PySpark 3.5 line's
KAFKA4_POM = JVM_DIR / "kafka4" / "pom.xml"
# The Java client lines the tests run on both: (pom, name used in test ids).
LINES = (POM, KAFKA4_POM)
LOG4J = JVM_DIR / "log4j.properties"
SOURCES = JVM_DIR / "src"


class JvmMissing(RuntimeError):
    """Java 17 or Maven is not installed."""


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "kafka-gateway" / "jvm"
    return Path(os.environ.get("KAFKA_GATEWAY_JVM_CACHE", default))


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise JvmMissing(
            f"`{name}` is not on PATH: install Java 17 and Maven "
            "(Debian: apt-get install -y openjdk-17-jdk-headless maven)"
        )
    return path


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def resolve(pom: Path = POM, quiet: bool = True) -> Path:
    """The directory holding every jar of ``pom``, resolving it if needed."""
    lib = cache_dir() / f"lib-{_digest(pom)}"
    complete = lib / ".complete"
    if complete.exists():
        return lib
    partial = lib.with_name(lib.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [tool("mvn"), "-B", "-f", str(pom), "dependency:copy-dependencies",
               f"-DoutputDirectory={partial}"]
    if quiet:
        command.insert(1, "-q")
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"mvn could not resolve {pom}:\n{done.stdout[-4000:]}"
                           f"{done.stderr[-4000:]}")
    if not any(partial.glob("kafka-clients-*.jar")):
        raise RuntimeError(f"mvn finished but {partial} has no kafka-clients jar")
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    (lib / ".complete").write_text("\n".join(sorted(p.name for p in lib.glob("*.jar"))))
    return lib


def kafka_version(pom: Path = POM) -> str:
    """The ``kafka.version`` property of ``pom``: the line's client version."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom.read_text())
    if match is None:
        raise ValueError(f"{pom} sets no kafka.version")
    return match.group(1)


def spark_pom(version: str) -> Path:
    """The connector pom for pyspark ``version``: the one whose spark.version it is."""
    for pom in (SPARK_POM, SPARK35_POM):
        if f"<spark.version>{version}</spark.version>" in pom.read_text():
            return pom
    raise ValueError(f"no connector pom for pyspark {version}: {SPARK_POM} and "
                     f"{SPARK35_POM} pin other versions (pyproject.toml's `spark` and "
                     "`spark35` extras pin the ones tested)")


def classpath(*extra: Path, pom: Path = POM) -> str:
    lib = resolve(pom)
    return os.pathsep.join([*map(str, extra), str(lib / "*")])


def compile_java(sources: Path = SOURCES, pom: Path = POM) -> Path:
    """Compile every ``*.java`` under ``sources`` against ``pom``'s jars, once;
    returns the classes dir, which names its pom in ``.pom``."""
    files = sorted(sources.rglob("*.java"))
    if not files:
        raise FileNotFoundError(f"no Java sources under {sources}")
    out = cache_dir() / f"classes-{kafka_version(pom)}-{_digest(pom, *files)}"
    if (out / ".complete").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # Relative to this checkout's jvm dir: the cache outlives checkouts, and a
    # checkout with the same sources and pom reuses these classes.
    (out / ".pom").write_text(str(pom.relative_to(JVM_DIR)))
    done = subprocess.run(
        [tool("javac"), "-nowarn", "-encoding", "UTF-8", "--release", "17",
         "-cp", classpath(pom=pom), "-d", str(out), *map(str, files)],
        capture_output=True, text=True, timeout=600,
    )
    if done.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        raise RuntimeError(f"javac failed:\n{done.stdout}{done.stderr}")
    (out / ".complete").touch()
    return out


def java_command(main_class: str, *args: str, classes: Path | None = None,
                 heap: str = "512m") -> list[str]:
    """The command line running ``main_class`` with the jars ``classes`` were
    compiled against (the 3.4.1 line's without classes)."""
    extra = [classes] if classes is not None else []
    pom = classes_pom(classes) if classes is not None else POM
    return [tool("java"), f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j.configuration=file:{LOG4J}", "-cp", classpath(*extra, pom=pom),
            main_class, *args]


def classes_pom(classes: Path) -> Path:
    """The pom (of this checkout) whose jars ``classes`` were compiled against."""
    marker = classes / ".pom"
    if not marker.exists():
        raise FileNotFoundError(f"{classes} was not made by compile_java (no .pom)")
    recorded = Path(marker.read_text())
    if recorded.is_absolute():
        raise FileNotFoundError(f"{classes} names its pom by an absolute path ({recorded}): "
                                "made by an older compile_java; delete it to compile again")
    return JVM_DIR / recorded
