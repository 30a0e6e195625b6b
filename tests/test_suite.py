"""The test suite's own rules, checked on its source and its helpers.

What it guards against: a test module importing ``conftest``, another test module or a
helper as ``tests.<name>`` gets a second copy of that module, with a second run seed and a
second port counter (two clusters on one port, a seed that does not replay). Shared
helpers live in ``support`` and are imported under that one name. And where CI asks for
Spark (``SR3_REQUIRE_SPARK=1``), a missing Java or PySpark must fail the Spark tests, not
skip them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import REQUIRE_SPARK_ENV, missing_spark_requirements, require_spark

TESTS = Path(__file__).resolve().parent


def forbidden_imports(source: str) -> list[str]:
    """The imports in ``source`` of conftest, of a test module, of ``tests.*`` or
    relative ones, anywhere in the module (functions and TYPE_CHECKING blocks too),
    and such names in ``pytest_plugins``."""
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.append((node.lineno, "." * node.level + (node.module or "")))
            elif node.module == "tests":
                names += [(node.lineno, f"tests.{alias.name}") for alias in node.names]
            else:
                names.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytest_plugins"
            for target in node.targets
        ):
            names += [
                (node.lineno, constant.value)
                for constant in ast.walk(node.value)
                if isinstance(constant, ast.Constant) and isinstance(constant.value, str)
            ]
    return [f"line {line}: {name}" for line, name in sorted(names) if _forbidden(name)]


def _forbidden(name: str) -> bool:
    top = name.split(".", maxsplit=1)[0]
    return name.startswith(".") or top in {"conftest", "tests"} or top.startswith("test_")


def test_the_rule_catches_each_kind_of_forbidden_import() -> None:
    source = (
        "from conftest import SEED\n"
        "import tests.support\n"
        "from tests import support\n"
        "from test_state_sync import materialize\n"
        "from . import support\n"
        "def f():\n    from tests.conftest import MakeCluster\n"
        'pytest_plugins = ("tests.spark_fixtures",)\n'
        "from support import SEED\nimport spark_fixtures\nimport testing_helpers\n"
        'pytest_plugins = ("spark_fixtures",)\n'
    )
    assert forbidden_imports(source) == [
        "line 1: conftest",
        "line 2: tests.support",
        "line 3: tests.support",
        "line 4: test_state_sync",
        "line 5: .",
        "line 7: tests.conftest",
        "line 8: tests.spark_fixtures",
    ]


@pytest.mark.parametrize("name", sorted(path.name for path in TESTS.glob("*.py")))
def test_no_module_imports_conftest_a_test_module_or_tests_dot(name: str) -> None:
    found = forbidden_imports((TESTS / name).read_text())
    assert not found, f"{name}: import shared helpers from `support` instead: {found}"


def without_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no `java` on it


def test_spark_tests_skip_without_java_when_spark_is_not_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without_java(monkeypatch, tmp_path)
    monkeypatch.delenv(REQUIRE_SPARK_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="Java 17"):
        require_spark()
    monkeypatch.setenv(REQUIRE_SPARK_ENV, "0")
    with pytest.raises(pytest.skip.Exception, match="Java 17"):
        require_spark()


def test_spark_tests_fail_without_java_or_a_module_when_spark_is_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(REQUIRE_SPARK_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="the Python module sr3_absent"):
        require_spark("sr3_absent")
    without_java(monkeypatch, tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"SR3_REQUIRE_SPARK=1 .*Java 17.*JAVA_HOME"):
        require_spark()
    # JAVA_HOME wins over PATH for PySpark: one without bin/java is no Java either.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="Java 17"):
        require_spark()


def test_an_unknown_require_spark_value_is_an_error_not_a_skip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without_java(monkeypatch, tmp_path)
    monkeypatch.setenv(REQUIRE_SPARK_ENV, "true")
    with pytest.raises(pytest.UsageError, match="expected 1"):
        require_spark()
    assert missing_spark_requirements()  # still reported, whatever the variable says
