"""Tenants and their API keys: the ``--api-keys`` TOML file, key checks and what each tenant may use.

One ``[[tenant]]`` table per tenant::

    [[tenant]]
    name = "a"
    key = "sk-..."                 # or key_sha256 = "<64 hex digits>"
    adapters = ["support-*", "t0"] # names or shell-style globs; ["*"] for every adapter
    base_model = true              # may it call the base model without an adapter (default true)
    requests_per_s = 10            # token bucket (omit: no limit)
    tokens_per_min = 100000        # prompt + generated tokens (omit: no limit)
    max_queued = 64                # requests waiting for the engine (omit: the server's queue share)
    admin = false                  # may load/unload adapters, read /metrics and /v1/state

Keys are kept only as SHA-256 digests and every check compares the presented key's digest with every tenant's in
constant time (``hmac.compare_digest``), so neither the file's keys nor the timing of a refusal leak a key.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpufleet.errors import ServeError

MIN_KEY_CHARS = 12  # a shorter key is guessable; OpenAI-style keys are far longer
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
ANONYMOUS = "anonymous"


def hash_key(key: str) -> str:
    """The SHA-256 hex digest a key is stored and compared as (``key_sha256`` in the keys file)."""
    return hashlib.sha256(key.encode()).hexdigest()


class TenantEntry(BaseModel):
    """One ``[[tenant]]`` table as written in the keys file (validated, unknown fields refused)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    key: str | None = Field(None, min_length=MIN_KEY_CHARS)
    key_sha256: str | None = None
    adapters: list[str] = Field(default_factory=list)
    base_model: bool = True
    requests_per_s: float | None = Field(None, gt=0)
    tokens_per_min: int | None = Field(None, gt=0)
    max_queued: int | None = Field(None, ge=0)
    admin: bool = False

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and not _HEX64.match(value.lower()):
            raise ValueError("must be the 64 hex digits of sha256(key), e.g. `printf %s KEY | sha256sum`")
        return None if value is None else value.lower()

    @field_validator("adapters")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        if any(not p.strip() for p in value):
            raise ValueError("adapter names and globs must not be empty")
        return value

    @model_validator(mode="after")
    def _one_key(self) -> TenantEntry:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give exactly one of key or key_sha256")
        return self


class KeysFile(BaseModel):
    """The whole keys file: ``queue_share`` and the tenants."""

    model_config = ConfigDict(extra="forbid")

    queue_share: float | None = Field(None, gt=0, le=1)
    tenant: list[TenantEntry] = Field(min_length=1)


@dataclass(frozen=True)
class Tenant:
    """A tenant as the server uses it: who, which key digest, what it may use, its limits."""

    name: str
    key_sha256: str
    adapters: tuple[str, ...] = ("*",)
    base_model: bool = True
    requests_per_s: float | None = None
    tokens_per_min: int | None = None
    max_queued: int | None = None
    admin: bool = False

    def may_use(self, adapter: str | None) -> bool:
        """Whether the tenant may call ``adapter`` (None: the base model)."""
        if adapter is None:
            return self.base_model
        return any(fnmatch.fnmatchcase(adapter, pattern) for pattern in self.adapters)


def anonymous_tenant() -> Tenant:
    """The one tenant of a server without ``--api-keys``: everything allowed, no limits, admin (loopback only)."""
    return Tenant(ANONYMOUS, "", ("*",), True, None, None, None, True)


class TenantRegistry:
    """The tenants of a keys file; ``authenticate`` maps a presented key to its tenant (or None)."""

    def __init__(self, tenants: list[Tenant], queue_share: float | None = None, source: str = "<memory>") -> None:
        self.tenants = list(tenants)
        self.source = source
        default_share = 1.0 if len(self.tenants) < 2 else 0.5
        self.queue_share = default_share if queue_share is None else queue_share
        _check_unique(self.tenants, source)

    def authenticate(self, key: str | None) -> Tenant | None:
        """The tenant whose key is ``key``; every tenant's digest is compared, in constant time."""
        if not key:
            return None
        digest = hash_key(key).encode()
        found = None
        for tenant in self.tenants:  # no early exit: the time taken does not depend on which tenant matched
            if hmac.compare_digest(digest, tenant.key_sha256.encode()):
                found = tenant
        return found

    def names(self) -> list[str]:
        """Tenant names in file order."""
        return [t.name for t in self.tenants]


def _check_unique(tenants: list[Tenant], source: str) -> None:
    seen_names: dict[str, int] = {}
    seen_keys: dict[str, str] = {}
    for i, tenant in enumerate(tenants):
        if tenant.name in seen_names:
            raise ServeError(
                f"{source}: tenant[{i}].name: '{tenant.name}' is also tenant[{seen_names[tenant.name]}]; "
                "tenant names must be unique"
            )
        seen_names[tenant.name] = i
        if tenant.key_sha256 in seen_keys:
            raise ServeError(
                f"{source}: tenant[{i}] ('{tenant.name}') has the same key as '{seen_keys[tenant.key_sha256]}'; "
                "give every tenant its own key"
            )
        seen_keys[tenant.key_sha256] = tenant.name


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "file"


def parse_keys(text: str, source: str = "<memory>") -> TenantRegistry:
    """Parse and validate keys-file text; errors name ``source`` and the field (``tenant[1].requests_per_s``)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ServeError(f"{source}: not valid TOML ({exc})") from exc
    try:
        parsed = KeysFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{_field_path(tuple(e['loc']))}: {e['msg']}" for e in exc.errors())
        hint = "one [[tenant]] table per tenant, see docs/serve_multitenant.md"
        raise ServeError(f"{source}: {problems} ({hint})") from exc
    tenants = [
        Tenant(
            name=e.name,
            key_sha256=e.key_sha256 if e.key_sha256 is not None else hash_key(e.key or ""),
            adapters=tuple(e.adapters),
            base_model=e.base_model,
            requests_per_s=e.requests_per_s,
            tokens_per_min=e.tokens_per_min,
            max_queued=e.max_queued,
            admin=e.admin,
        )
        for e in parsed.tenant
    ]
    return TenantRegistry(tenants, parsed.queue_share, source)


def load_keys(path: str | Path) -> TenantRegistry:
    """Read ``--api-keys FILE``; a missing or invalid file raises ServeError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ServeError(f"--api-keys {path}: no such file (a TOML file with one [[tenant]] table per tenant)")
    return parse_keys(path.read_text(), str(path))


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, tenants: TenantRegistry | None) -> str:
    """The start-up line about access; refuses a non-loopback ``host`` without keys (anyone on the network would
    have every adapter and the admin endpoints)."""
    if tenants is not None:
        return f"API keys: {len(tenants.tenants)} tenant(s) from {tenants.source}"
    if not is_loopback(host):
        raise ServeError(
            f"--host {host} without --api-keys would let anyone who can reach it use every adapter and load new "
            "ones; give --api-keys FILE (docs/serve_multitenant.md) or serve on 127.0.0.1"
        )
    return f"no --api-keys: listening on {host} only, every local client may use every adapter and the admin endpoints"
