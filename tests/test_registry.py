"""The generic name -> factory registry behind readers and failure models."""

from __future__ import annotations

from typing import ClassVar

import pytest

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.registry import Registry


class Widget:
    name: ClassVar[str] = ""

    def __init__(self, size: int = 1) -> None:
        self.size = size


def make_registry(**kw: object) -> Registry[Widget]:
    return Registry("widget", ConfigError, **kw)  # type: ignore[arg-type]


def test_register_sets_name_and_creates_instances_with_options() -> None:
    reg = make_registry()

    @reg.register("big")
    class Big(Widget):
        pass

    assert Big.name == "big"
    assert "big" in reg and "small" not in reg
    assert reg.get("big") is Big
    made = reg.create("big", size=7)
    assert isinstance(made, Big) and made.size == 7


def test_set_name_false_leaves_the_class_alone_and_plain_functions_register() -> None:
    reg = make_registry(set_name=False)

    @reg.register("alias")
    class Named(Widget):
        name = "original"

    @reg.register("fn")
    def build(size: int = 2) -> Widget:
        return Widget(size)

    assert Named.name == "original"
    assert reg.create("fn").size == 2
    assert [name for name, _ in reg.items()] == ["alias", "fn"]


def test_names_sorted_and_iteration_in_registration_order() -> None:
    reg = make_registry()
    for name in ("zeta", "alpha", "mid"):
        reg.register(name)(type(name, (Widget,), {}))
    assert reg.names() == ["alpha", "mid", "zeta"]
    assert list(reg) == ["zeta", "alpha", "mid"]
    assert len(reg) == 3


def test_unknown_name_raises_the_given_error_listing_names() -> None:
    reg = make_registry()
    reg.register("b")(Widget)
    reg.register("a")(Widget)
    with pytest.raises(ConfigError, match=r"^unknown widget 'c'; available widgets: a, b$"):
        reg.create("c")
    with pytest.raises(ConfigError):
        reg["c"]


def test_custom_listing_empty_hint_and_default_error() -> None:
    reg = make_registry(listing="known", empty="none (install extras)")
    with pytest.raises(ConfigError, match=r"^unknown widget 'x'; known: none \(install extras\)$"):
        reg.get("x")
    plain: Registry[Widget] = Registry("gadget")
    with pytest.raises(GpufleetError, match="available gadgets: none"):
        plain.get("x")


def _package(tmp_path, monkeypatch, name: str, modules: dict[str, str]) -> None:
    """A throwaway package ``name`` on sys.path holding ``modules`` (file name -> source)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for module, source in modules.items():
        (folder / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_package_modules_are_discovered_on_first_lookup_and_missing_extras_skipped(tmp_path, monkeypatch) -> None:
    import sys

    reg = make_registry(package="toyplugins", optional=("no_such_extra_pkg",))
    monkeypatch.setitem(sys.modules, "toy_registry_holder", type(sys)("toy_registry_holder"))
    sys.modules["toy_registry_holder"].REG = reg  # type: ignore[attr-defined]
    decorate = (
        "from toy_registry_holder import REG\n\n@REG.register('{0}')\nclass W:\n    '''{0} widget.\n\n    more'''\n"
    )
    _package(
        tmp_path,
        monkeypatch,
        "toyplugins",
        {
            "alpha": decorate.format("alpha"),
            "beta": decorate.format("beta"),
            "needs_extra": "import no_such_extra_pkg\n" + decorate.format("extra"),
        },
    )
    assert reg.names() == ["alpha", "beta"]
    assert reg.summaries() == {"alpha": "alpha widget.", "beta": "beta widget."}
    assert reg.help_text() == "alpha: alpha widget.; beta: beta widget."


def test_a_module_failing_for_another_reason_is_not_hidden(tmp_path, monkeypatch) -> None:
    _package(tmp_path, monkeypatch, "brokenplugins", {"bad": "import no_such_module_at_all\n"})
    reg = make_registry(package="brokenplugins")
    with pytest.raises(ImportError):
        reg.names()
    with pytest.raises(ImportError):  # and again on the next lookup, not a quietly empty list
        reg.names()


def test_create_rejects_options_the_factory_does_not_take_in_one_line() -> None:
    reg = make_registry()
    reg.register("w")(Widget)
    with pytest.raises(ConfigError, match=r"^widget 'w' takes no option\(s\) colour; its options are: size$"):
        reg.create("w", colour="red")


def test_suggest_names_the_closest_entry() -> None:
    reg = make_registry(suggest=True, listing="Available")
    reg.register("fifo")(Widget)
    with pytest.raises(ConfigError, match=r"^unknown widget 'fifoo'\. Did you mean 'fifo'\? Available: fifo$"):
        reg.get("fifoo")


def test_detect_prefers_a_sniffing_reader_then_the_suffix_then_content_only_readers(tmp_path) -> None:
    reg = make_registry()

    class Plain(Widget):
        suffixes = (".csv",)

    class Special(Widget):
        suffixes = (".csv",)

        @classmethod
        def sniff(cls, path):
            return path.read_text().startswith("special")

    class Content(Widget):
        @classmethod
        def sniff(cls, path):
            return path.read_text().startswith("#")

    for name, cls in (("plain", Plain), ("special", Special), ("content", Content)):
        reg.register(name)(cls)
    for file, text, expected in (
        ("a.csv", "special,x", "special"),
        ("b.csv", "x,y", "plain"),
        ("c.txt", "# hi", "content"),
        ("d.txt", "hi", "fallback"),
    ):
        (tmp_path / file).write_text(text)
        assert reg.detect(tmp_path / file, fallback="fallback") == expected


def test_added_registers_for_a_block_only() -> None:
    reg = make_registry()
    with reg.added("temp", Widget):
        assert "temp" in reg
    assert "temp" not in reg
