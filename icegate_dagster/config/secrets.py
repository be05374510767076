"""Which values of the configuration are secrets, and how text is cleaned of them.

A value is a secret because of **what it is**, never because of where a ``${VAR}``
appears: the value of a setting whose key names a secret (``password``, ``token``,
``credential``, ``header.Authorization``, ``s3.secret-access-key``...), and the secret
parts of a URI or of a ``key=value`` list (``user:password@``, ``?password=``,
``&token=``, ``-Dfs.s3a.secret.key=``). ``catalog.name: ${CATALOG_NAME}`` is a name.

Masking replaces whole values only: a secret ``gate`` is masked in ``gate.`` or ``=gate``
but leaves ``icegate`` alone. :func:`config_secrets` gathers every secret of a loaded
configuration, and :func:`scrub` masks them in an engine's message; :func:`redact_uri` and
:func:`redact_properties` make a URI or the catalog's properties safe to print.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from urllib.parse import quote, unquote

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from icegate_dagster.config.models import CatalogSettings, IcegateConfig

MASK = "***"

#: Words of a setting's key that say its value is a secret (searched anywhere in the key,
#: any case: ``PGPASSWORD``, ``sessionToken``, ``header.X-Api-Key``, ``header.Cookie``).
_SECRET_KEY = re.compile(
    r"password|passwd|passphrase|secret|token|credential|authorization|cookie|private"
    r"|(access|session|account|api|auth|encryption|master)[-_.]?key",
    re.IGNORECASE,
)
#: Query parameters that carry a secret without saying so in a word of their own
#: (``?key=`` of an API, ``?sig=``/``X-Amz-Signature=`` of a signed URL, ODBC's ``PWD=``).
_SECRET_PARAMETERS = {"key", "sig", "pwd"}
#: Values of secret-looking keys that are flags, not secrets (``token-refresh-enabled``).
_FLAGS = {"true", "false"}
#: ``scheme://user:password@`` (a password holds no ``/``, ``@`` or space unencoded).
_USERINFO = re.compile(r"(?P<lead>//(?P<user>[^:/@\s]*):)(?P<password>[^@/\s]+)(?=@)")
#: ``name=value`` in a query string (``?``, ``&``, ``;``), a Java option (``-D``) or a
#: space-separated list.
_PARAMETER = re.compile(r"(?P<lead>(?:^|[?&;\s]|-D)(?P<name>[\w.\-]+)=)(?P<value>[^&;#\s]*)")
#: ``Bearer <token>``, ``Basic <base64>``: an HTTP credential after its scheme.
_AUTH_SCHEME = re.compile(r"^[A-Za-z][\w-]*\s+(?P<credential>\S+)$")
#: Parts of a secret masked on their own (a token after ``Bearer``, a client secret after
#: ``id:``) only from this length: shorter ones are too likely to be ordinary words.
_MIN_PART = 4


def is_secret_key(key: str) -> bool:
    """Whether a setting's key says its value is a secret (password, token, key...)."""
    return bool(_SECRET_KEY.search(key))


def is_secret_parameter(name: str) -> bool:
    """Whether a query parameter (``?name=value``) carries a secret."""
    lowered = name.lower()
    return is_secret_key(name) or lowered in _SECRET_PARAMETERS or "signature" in lowered


def _secret_pair(match: re.Match[str]) -> bool:
    """Whether a ``name=value`` found by :data:`_PARAMETER` holds a secret: a secret key's
    value, or in a query string (after ``?``, ``&``, ``;``) a secret parameter's; never a
    flag (``token-refresh-enabled=true``)."""
    name, value = match.group("name"), match.group("value")
    if not value or is_flag(value):
        return False
    in_query = match.group("lead")[:1] in ("?", "&", ";")
    return is_secret_parameter(name) if in_query else is_secret_key(name)


def is_flag(value: str) -> bool:
    """``true``/``false``: a setting about a secret, never a secret itself."""
    return value.strip().lower() in _FLAGS


def secret_parts(value: str) -> list[str]:
    """Every secret inside a value that is no secret as a whole: passwords of the URIs it
    holds and values of its secret parameters (``?password=``, ``-D...secret.key=``)."""
    found = [m.group("password") for m in _USERINFO.finditer(value)]
    found += [m.group("value") for m in _PARAMETER.finditer(value) if _secret_pair(m)]
    return [part for part in found if part]


def storage_uri_secrets(uri: str) -> list[str]:
    """The secrets of a storage URI: also the ``user`` of ``user:password@``, which there
    is an access key (``s3://AKIA...:secret@bucket``)."""
    users = [m.group("user") for m in _USERINFO.finditer(uri)]
    return [*filter(None, users), *secret_parts(uri)]


def secret_value_parts(value: str) -> list[str]:
    """A secret setting's value and the parts an error may echo alone: the credential after
    an HTTP scheme (``Bearer <token>``), the secret after ``<client id>:``."""
    if not value.strip() or is_flag(value):
        return []
    parts = [value]
    scheme = _AUTH_SCHEME.match(value.strip())
    if scheme:
        parts.append(scheme.group("credential"))
    if "://" not in value and ":" in value:
        parts.append(value.split(":", 1)[1])
    return [parts[0], *(part for part in parts[1:] if len(part) >= _MIN_PART)]


def redact(text: str) -> str:
    """``text`` with the secret parts of the URIs and parameters it holds masked (by their
    place: the password of ``user:password@``, the value of ``?password=``)."""
    text = _USERINFO.sub(lambda m: m.group("lead") + MASK, text)
    return _PARAMETER.sub(lambda m: m.group("lead") + MASK if _secret_pair(m) else m.group(0), text)


def ordered(secrets: Iterable[str]) -> tuple[str, ...]:
    """The distinct secrets, longest first (a secret inside another is masked after it)."""
    kept = {s for s in secrets if s.strip() and not is_flag(s)}
    return tuple(sorted(kept, key=lambda s: (-len(s), s)))


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every whole occurrence of a secret masked: as written, percent-encoded
    (in a URI) or decoded; never where it is only a piece of a longer word."""
    pattern = _mask_pattern(ordered(secrets))
    return text if pattern is None else pattern.sub(MASK, text)


def holds_secret(value: str, secrets: Iterable[str]) -> bool:
    """Whether ``value`` holds one of ``secrets`` as a whole (see :func:`mask`)."""
    pattern = _mask_pattern(ordered(secrets))
    return pattern is not None and pattern.search(value) is not None


@lru_cache(maxsize=64)
def _mask_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    variants = ordered(
        form for secret in secrets for form in (secret, quote(secret, safe=""), unquote(secret))
    )
    if not variants:
        return None
    return re.compile("|".join(_whole(secret) for secret in variants))


def _whole(secret: str) -> str:
    """``secret`` as a pattern that cannot match inside a longer word."""
    before = r"(?<!\w)" if re.match(r"\w", secret[0]) else ""
    after = r"(?!\w)" if re.match(r"\w", secret[-1]) else ""
    return before + re.escape(secret) + after


def redact_uri(uri: str) -> str:
    """The URI with its secrets masked: the password of ``user:password@`` and the value
    of every secret query parameter (``?password=``, ``&token=``, ``X-Amz-Signature=``)."""
    return mask(redact(uri), _url_password(uri))


def _url_password(uri: str) -> list[str]:
    """The password SQLAlchemy reads from a URI (it may hold characters the plain pattern
    of :func:`redact` stops at)."""
    try:
        password = make_url(uri).password if "://" in uri else None
    except (ArgumentError, ValueError):
        return []
    return [str(password)] if password else []


def redact_properties(props: Mapping[str, str]) -> dict[str, str]:
    """Catalog properties safe to print: secret values become ``***``, the secret parts of
    the others (a URI's password, ``?password=``) too."""
    return {
        key: MASK if is_secret_key(key) and not is_flag(value) else redact_uri(value)
        for key, value in props.items()
    }


def secret_values(settings: CatalogSettings) -> list[str]:
    """Every secret the catalog settings hold (for scrubbing engine messages): values of
    secret keys, and the secret parts of the others (``uri``'s password, ``?password=``)."""
    values: list[str] = []
    for key, value in settings.properties.items():
        if is_secret_key(key):
            values += secret_value_parts(value)
        else:
            values += secret_parts(value)
    return values + _url_password(settings.properties.get("uri", ""))


def config_secrets(config: IcegateConfig) -> tuple[str, ...]:
    """Every secret the configuration holds, longest first: the catalog's, the values of
    secret ``spark.conf`` keys, the secret parts of every other value (URI passwords,
    ``?password=``), ``wal.root``'s keys, the values of secret ``wal.storage`` keys and each
    ``${VAR}`` value put under a secret key."""
    values = [*secret_values(config.catalog), *config.secrets]
    for key, value in config.spark.conf.items():
        values += secret_value_parts(value) if is_secret_key(key) else secret_parts(value)
    if config.wal_root:
        values += storage_uri_secrets(config.wal_root)  # s3://<access key>:<secret>@
    for key, value in (config.wal_storage or {}).items():
        values += secret_value_parts(value) if is_secret_key(key) else secret_parts(value)
    if config.locks.uri:
        values += [*secret_parts(config.locks.uri), *_url_password(config.locks.uri)]
    if config.spark.remote:
        values += secret_parts(config.spark.remote)  # sc://host:port/;token=...
    return ordered(values)


def scrub(text: str, source: IcegateConfig | CatalogSettings) -> str:
    """Mask every secret of the configuration (or of a catalog alone) in ``text``, whole
    values only: errors from drivers, Spark and Iceberg may echo them."""
    secrets = config_secrets(source) if isinstance(source, IcegateConfig) else secret_values(source)
    return mask(redact(text), secrets)
