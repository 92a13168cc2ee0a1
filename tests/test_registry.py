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
