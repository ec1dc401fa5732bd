"""Scripted faults of an S3 client's conditional create: wrappers around a real client
(s3fs's filesystem or txlog's obstore client) that make the next creates fail the way a
real server or network does (applied but answered with an error, dropped, or the condition
ignored), so the store's settling of ambiguous outcomes can be tested against a real server.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any


def _client_error(code: str, status: int, message: str) -> Exception:
    """The exception s3fs raises for an S3 error response (through its own translation)."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    err = ClientError({"Error": {"Code": code, "Message": message},
                       "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
    return translate_boto_error(err)  # type: ignore[no-any-return]


def seaweed_412() -> Exception:
    # What s3fs raises for SeaweedFS's 412 (no <Condition> element): OSError(EINVAL).
    return _client_error("PreconditionFailed", 412,
                         "At least one of the pre-conditions you specified did not hold")


def _read_timeout() -> Exception:
    from botocore.exceptions import ReadTimeoutError

    err: Exception = ReadTimeoutError(endpoint_url="http://127.0.0.1/txlog-test/k")
    return err


FAULTS: dict[str, Callable[[], Exception]] = {
    "412": seaweed_412,
    "exists": lambda: FileExistsError("k"),
    "timeout": lambda: TimeoutError("timed out"),
    "read-timeout": _read_timeout,
    "connection": lambda: ConnectionResetError(errno.ECONNRESET, "reset by peer"),
    "500": lambda: _client_error("InternalError", 500, "We encountered an internal error"),
    "409": lambda: _client_error("ConditionalRequestConflict", 409,
                                 "A conflicting conditional operation is in progress"),
    "403": lambda: _client_error("AccessDenied", 403, "Access Denied"),
    "501": lambda: _client_error("NotImplemented", 501, "not implemented"),
}


class ScriptedCreateFS:
    """Wraps a real fsspec filesystem; conditional creates follow a script of faults.

    ``"apply-412"``: the server applies the create but the client sees a 412;
    ``"drop-timeout"``: the request never lands and the client sees a timeout;
    ``"ignore"``: the server ignores the condition (a plain overwrite, reported success).
    Once the script is used up, creates go to the real server unchanged.
    """

    def __init__(self, fs: Any, script: list[str]) -> None:
        self._fs = fs
        self.script = list(script)
        self.seen: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite", **kw: Any) -> Any:
        if mode != "create" or not self.script:
            return self._fs.pipe_file(path, data, mode=mode, **kw)
        action = self.script.pop(0)
        self.seen.append(action)
        if action == "ignore":
            return self._fs.pipe_file(path, data, **kw)
        landing, _, fault = action.partition("-")
        if landing == "apply":
            self._fs.pipe_file(path, data, mode="create", **kw)
        raise FAULTS[fault]()


def _obstore_error(status: int, reason: str) -> Exception:
    from obstore.exceptions import GenericError

    return GenericError(f"Generic S3 error: Error performing PUT http://127.0.0.1/k in 1ms - "
                        f"Server returned non-2xx status code: {status} {reason}: ")


def _obstore_faults() -> dict[str, Any]:
    """The same faults as obstore raises them (its retries exhausted, or final answers)."""
    from obstore.exceptions import AlreadyExistsError, GenericError

    return {
        "412": lambda: AlreadyExistsError("Object at location k already exists: Request "
                                          "precondition failure"),
        "exists": lambda: AlreadyExistsError("Object at location k already exists"),
        "timeout": lambda: GenericError("Generic S3 error: Error after 10 retries in 3s, "
                                        "max_retries:10: HTTP error: operation timed out"),
        "read-timeout": lambda: GenericError("Generic S3 error: HTTP error: error decoding "
                                             "response body: operation timed out"),
        "connection": lambda: GenericError("Generic S3 error: HTTP error: error sending "
                                           "request: connection reset by peer"),
        "500": lambda: _obstore_error(500, "Internal Server Error"),
        # object_store raises a 409 on a conditional PUT as AlreadyExistsError.
        "409": lambda: AlreadyExistsError(
            "Object at location k already exists: Error performing PUT http://127.0.0.1/k "
            "in 1ms - Server returned non-2xx status code: 409 Conflict: "
            "ConditionalRequestConflict"),
        "403": lambda: _obstore_error(403, "Forbidden"),
        "501": lambda: _obstore_error(501, "Not Implemented"),
    }


class ScriptedCreateObstore:
    """:class:`ScriptedCreateFS` for the obstore client: wraps txlog's ObstoreS3."""

    def __init__(self, fast: Any, script: list[str]) -> None:
        self._fast = fast
        self.script = list(script)
        self.seen: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fast, name)

    def create(self, key: str, data: bytes) -> None:
        if not self.script:
            return self._fast.create(key, data)  # type: ignore[no-any-return]
        action = self.script.pop(0)
        self.seen.append(action)
        if action == "ignore":
            return self._fast.put(key, data)  # type: ignore[no-any-return]
        landing, _, fault = action.partition("-")
        if landing == "apply":
            self._fast.create(key, data)
        raise _obstore_faults()[fault]()
