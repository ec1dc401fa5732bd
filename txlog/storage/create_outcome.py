"""How a failed request to a remote store is settled: the outcome classes of a failed
conditional create, and the errors that say the server could not be reached.

Outcomes of a conditional create and how the store settles them:

* success: we created the object.
* "already exists" (``FileExistsError``; or, on SeaweedFS and other S3-compatible servers
  that answer 412 without a ``Condition`` element, s3fs's ``OSError(EINVAL, 'At least
  one of the pre-conditions you specified did not hold')``): *lost*, yet ambiguous,
  because the client libraries retry a timed-out request on their own, and the retry is
  answered "already exists" when the first attempt had won.  Settled by reading the
  object back and comparing its bytes with ours.
* 409 ``ConditionalRequestConflict`` (a concurrent conditional write to the same key was
  in flight): *conflict*, our write was not applied; back off and retry.
* timeouts, dropped connections, 5xx: *ambiguous*, the request may or may not have been
  applied.  Settled by reading back: our bytes mean we won, other bytes mean we lost, no
  object means nothing landed, so the create is retried (a delayed duplicate of ours that
  lands later is itself conditional, so retrying is safe).
* 501 or ENOSYS: *unsupported*, the server cannot create conditionally.
* anything else the caller did wrong (403, 404 of the bucket, other 4xx): *fatal*.
"""

from __future__ import annotations

import errno
from typing import Any

from txlog.storage import obstore_s3

LOST = "lost"            # the server says an object exists (maybe ours, from a retry)
CONFLICT = "conflict"    # 409: concurrent conditional write in flight; ours not applied
AMBIGUOUS = "ambiguous"  # may or may not have been applied
UNSUPPORTED = "unsupported"
FATAL = "fatal"


def client_error_info(exc: BaseException) -> tuple[str, int | None]:
    """(error code, HTTP status) of the botocore ClientError behind ``exc``, if any."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", "") or "")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code, int(status) if status is not None else None
        # azure.core HttpResponseError and gcsfs HttpError carry a status directly.
        for attr in ("status_code", "status", "code"):
            value = getattr(cur, attr, None)
            if isinstance(value, int) and 100 <= value < 600:
                return "", value
        cur = cur.__cause__ or cur.__context__
    return "", None


def _is_network_error(exc: BaseException) -> bool:
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    try:
        from botocore.exceptions import HTTPClientError, ResponseParserError

        if isinstance(exc, (HTTPClientError, ResponseParserError)):
            return True
    except ImportError:  # pragma: no cover - botocore comes with s3fs
        pass
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):
            return True
    except ImportError:  # pragma: no cover
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        if isinstance(exc, FSTimeoutError):
            return True
    except ImportError:  # pragma: no cover
        pass
    return False


def classify_create_error(exc: BaseException) -> str:
    """How a conditional create that raised ``exc`` through fsspec is settled (see the
    module docstring)."""
    if isinstance(exc, FileExistsError):
        return LOST
    code, status = client_error_info(exc)
    if code == "PreconditionFailed" or status == 412:
        return LOST
    if code == "ConditionalRequestConflict" or status == 409:
        return CONFLICT
    if code == "NotImplemented" or status == 501:
        return UNSUPPORTED
    if code in ("InternalError", "SlowDown", "ServiceUnavailable", "RequestTimeout") or (
        status is not None and (status >= 500 or status == 408)
    ):
        return AMBIGUOUS
    if _is_network_error(exc):
        return AMBIGUOUS
    if isinstance(exc, (PermissionError, FileNotFoundError, IsADirectoryError)):
        return FATAL
    if isinstance(exc, OSError):
        message = str(exc).lower().replace("-", "")
        if exc.errno == errno.EINVAL and "precondition" in message:
            return LOST
        if "conditionalrequestconflict" in message.replace(" ", ""):
            return CONFLICT
        if exc.errno == errno.ENOSYS:
            return UNSUPPORTED
        if status is not None and 400 <= status < 500:
            return FATAL
        # Unknown I/O trouble: it may have been applied; settle by reading back.
        return AMBIGUOUS
    return FATAL


def outcome(exc: BaseException, fast: Any) -> str:
    """How a failed conditional create is settled, by the client that raised it (``fast``:
    the store's obstore client, or None where fsspec served the request)."""
    return obstore_s3.create_outcome(exc) if fast is not None else classify_create_error(exc)


_UNREACHABLE_TYPES = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectTimeout",
                      "ClientConnectorError", "ServerTimeoutError", "NewConnectionError")
_UNREACHABLE_TEXT = ("connection refused", "error sending request", "tcp connect error",
                     "dns error", "failed to lookup address", "could not connect",
                     "name or service not known", "connect timeout")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it wraps) says the server could not be reached."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (ConnectionRefusedError, ConnectionAbortedError)) \
                or type(e).__name__ in _UNREACHABLE_TYPES:
            return True
        text = str(e).lower()
        if any(t in text for t in _UNREACHABLE_TEXT):
            return True
        e = e.__cause__ or e.__context__
    return False


def write_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it wraps) says this client may not write there
    (permissions, a read-only file system, 403): no retry mends it, unlike a timeout."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, PermissionError) or type(e).__name__ == "PermissionDeniedError" \
                or (isinstance(e, OSError) and e.errno == errno.EROFS):
            return True
        if client_error_info(e)[1] == 403:
            return True
        e = e.__cause__ or e.__context__
    return False
