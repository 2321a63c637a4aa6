"""Starting Spark for the jobs, with Spark's Kafka connector.

The connector is ``org.apache.spark:spark-sql-kafka-0-10_<scala>`` at the
installed pyspark's version (Scala 2.12 for Spark 3, 2.13 for Spark 4): the
pair is always pyspark X.Y.Z with ``spark-sql-kafka-0-10_<scala>:X.Y.Z``. It
comes from one of:

1. the JVM cache, ``$KAFKA_GATEWAY_JVM_CACHE`` (default
   ``~/.cache/kafka-gateway/jvm``): any directory there holding the
   connector's jar with its dependencies, as ``tests/run_all.sh`` leaves it
   (``mvn dependency:copy-dependencies`` on ``compat_tests/jvm/spark/pom.xml``
   for PySpark 4, ``compat_tests/jvm/spark35/pom.xml`` for 3.5).
   Jars whose artifact pyspark already ships (scala-library, hadoop-client,
   slf4j, snappy, ...) are left out, so Spark keeps its own versions;
2. Maven Central through ``spark.jars.packages`` (``--packages``), which
   Spark resolves with Ivy at start-up.

Neither available is :class:`ConnectorMissing`, whose message says how to
get one. The jobs' own package is zipped and shipped with ``addPyFile`` so
executors (local or on a cluster) import the same code as the driver.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ROOT = PACKAGE_DIR.parent
# The connector poms of the two PySpark lines the project tests: 4.x (the
# `spark` extra, the default) and 3.5 (the `spark35` extra).
SPARK_POM = ROOT / "compat_tests" / "jvm" / "spark" / "pom.xml"
SPARK35_POM = ROOT / "compat_tests" / "jvm" / "spark35" / "pom.xml"
# "<artifact>-<version>.jar": the version is the first dash-part starting "<digits>."
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+\.[\w.\-]*)\.jar$")


class ConnectorMissing(RuntimeError):
    """Spark's Kafka connector is neither in the cache nor requested with --packages."""


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def scala_binary_version(version: str) -> str:
    """The Scala build pip's pyspark ships: 2.12 for Spark 3, 2.13 from Spark 4."""
    return "2.13" if int(version.split(".")[0]) >= 4 else "2.12"


def connector_coordinates(version: str) -> str:
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala_binary_version(version)}:{version}"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "kafka-gateway" / "jvm"
    return Path(os.environ.get("KAFKA_GATEWAY_JVM_CACHE", default))


def _artifact(jar: Path) -> str:
    match = _JAR_NAME.match(jar.name)
    return match.group("artifact") if match else jar.stem


def spark_jars_dir() -> Path:
    """The jars Spark itself runs with (the pip package's, or $SPARK_HOME's)."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def cached_connector(version: str) -> list[Path] | None:
    """The connector's jars from the cache, minus those Spark already ships."""
    artifact = connector_coordinates(version).split(":")[1]
    found = sorted(p for p in cache_dir().glob(f"*/{artifact}-{version}.jar")
                   if not p.parent.name.endswith(".partial"))
    if not found:
        return None
    shipped = {_artifact(jar) for jar in spark_jars_dir().glob("*.jar")}
    return sorted(jar for jar in found[0].parent.glob("*.jar")
                  if _artifact(jar) not in shipped)


def connector_conf(packages: bool = False) -> dict[str, str]:
    """The Spark settings that put the connector on the classpath."""
    version = spark_version()
    coordinates = connector_coordinates(version)
    if packages:
        return {"spark.jars.packages": coordinates}
    jars = cached_connector(version)
    if jars is None:
        raise ConnectorMissing(missing_message(version))
    return {"spark.jars": ",".join(map(str, jars))}


def connector_pom(version: str) -> Path:
    """The pom pinning ``version``'s connector; Spark 4's (the default) for any other,
    which the -D overrides of missing_message() then retarget."""
    return SPARK35_POM if version.startswith("3.") else SPARK_POM


def missing_message(version: str) -> str:
    coordinates = connector_coordinates(version)
    return (
        f"Spark's Kafka connector {coordinates} (for the installed pyspark {version}) "
        f"is not in the cache {cache_dir()} and --packages was not given.\n"
        "Either put it in the cache with Maven (what tests/run_all.sh does):\n"
        f"    mvn -q -f {connector_pom(version)} dependency:copy-dependencies "
        f"-Dspark.version={version} "
        f"-Dscala.binary.version={scala_binary_version(version)} "
        f"-DoutputDirectory={cache_dir() / ('spark-' + version)}\n"
        "or let Spark download it from Maven Central at start-up: add --packages."
    )


def package_zip() -> Path:
    """spark_jobs as a zip for ``addPyFile``: executors import the driver's code."""
    out = Path(tempfile.mkdtemp(prefix="spark-jobs-")) / "spark_jobs.zip"
    with zipfile.ZipFile(out, "w") as archive:
        for source in sorted(PACKAGE_DIR.glob("*.py")):
            archive.write(source, f"spark_jobs/{source.name}")
    return out


def start(app_name: str, master: str = "local[*]", packages: bool = False,
          conf: Mapping[str, str] | None = None):
    """A SparkSession with the connector; raises ConnectorMissing first if there
    is none, before any JVM starts."""
    settings = connector_conf(packages)
    # Python workers of a local Spark run this interpreter, not whatever
    # `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {"spark.ui.showConsoleProgress": "false", **settings,
                       **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.sparkContext.addPyFile(str(package_zip()))
    return spark
