"""Turn what goes wrong between the CLI and a cluster into one sentence that says what to do.

The ``kubernetes`` client raises an ``ApiException`` carrying a JSON ``Status`` body, or a
urllib3 error wrapped three deep, and prints neither well. A user wants to read "namespace
"x" does not exist; pick an existing one with -n", not a traceback. The sentence builders here
are pure (status code, body, what we were doing, where we were pointed), so every case is a
unit test; :func:`translate` is the one place that catches the client's exceptions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

CRD_HINT = "install the CRD first: torchkube crd | kubectl apply --server-side -f -"
CONTEXT_HINT = (
    "check that the cluster is running and that this is the right context "
    "(--context, --kubeconfig or KUBECONFIG)"
)


class ClientError(Exception):
    """A failure already phrased for the user: printed as is, without a traceback."""

    def __init__(self, message: str, exit_code: int = 1, details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.details = details
        """Lines printed before the sentence (e.g. one per invalid field)."""


@dataclass(frozen=True)
class Target:
    """Where a command was pointed, so an error can name the server, context and namespace."""

    server: str = ""
    context: str = ""
    namespace: str = ""
    kubeconfig: str = ""

    def where(self) -> str:
        """``the API server at URL (context C)``: what a user needs to spot the wrong cluster."""
        text = f"the API server at {self.server}" if self.server else "the API server"
        return f"{text} (context {self.context})" if self.context else text


def parse_status(body: str | bytes | None) -> dict[str, Any]:
    """The ``Status`` object of an error response; a plain-text body becomes its message."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    text = (body or "").strip()
    try:
        parsed = json.loads(text) if text.startswith("{") else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    return {"message": text}


def yaml_problem(error: BaseException) -> str:
    """``line 3, column 5: expected ',' or ']'`` from a PyYAML error (its own text is 5 lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).strip().splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else str(problem)


_INVALID_VALUE = re.compile(r'Invalid value: "[^"]*": ')


def _cause_text(cause: dict[str, Any]) -> str:
    """``spec.replicas: replicas.min must be ...`` without the ``Invalid value: "object"`` noise."""
    message = _INVALID_VALUE.sub("", str(cause.get("message", ""))).strip()
    field = cause.get("field")
    return f"{field}: {message}" if field else message


def refusal_details(status: dict[str, Any]) -> str:
    """The rule(s) the apiserver applied, one ``field: message`` per cause, joined by '; '."""
    causes = (status.get("details") or {}).get("causes") or []
    if causes:
        return "; ".join(_cause_text(c) for c in causes)
    message = str(status.get("message", ""))
    # "TrainingJob.torchkube.io "x" is invalid: spec...: Invalid value: ...": keep the tail.
    _, sep, tail = message.partition(" is invalid: ")
    return _INVALID_VALUE.sub("", tail if sep else message).strip()


def api_error(
    status_code: int | None,
    body: str | bytes | None,
    reason: str | None,
    *,
    action: str,
    target: Target,
    resource: str = "trainingjobs",
) -> str:
    """One sentence for an error response of the API server.

    ``action`` is what we tried, as a verb phrase (``create TrainingJob "x"``); ``resource`` is
    the plural of what the request was about, so a 404 without a name (the API is not served at
    all) can say that the CRD is missing.
    """
    code = status_code or 0
    status = parse_status(body)
    message = str(status.get("message") or reason or "").strip()
    details = status.get("details") or {}
    kind, name = str(details.get("kind", "")), str(details.get("name", ""))
    namespace = target.namespace
    where = target.where()
    if code == 404:
        if kind == "namespaces":
            return (
                f'namespace "{name}" does not exist on {where}; pick an existing one with '
                "-n/--namespace (kubectl get namespaces lists them)"
            )
        if kind == "trainingjobs" and name:
            return (
                f'TrainingJob "{name}" not found in namespace "{namespace}"; torchkube status '
                "lists the jobs there (-A for all namespaces)"
            )
        if kind == "pods" and name:
            return f'pod "{name}" is gone (replaced or deleted); run the command again'
        if not name and resource == "trainingjobs":
            return f"{where} does not serve TrainingJobs (torchkube.io/v1alpha1); {CRD_HINT}"
        return f"could not {action}: {message or 'not found'}"
    if code == 409:
        if status.get("reason") == "AlreadyExists":
            return f'{_kind_name(kind)} "{name}" already exists in namespace "{namespace}"'
        return (
            f"could not {action}: it changed while this command wrote it ({message}); "
            "run the command again"
        )
    if code == 422:
        return f"the cluster refused to {action}: {refusal_details(status)}"
    if code == 400:
        return f"could not {action}: {message}"
    if code == 401:
        return (
            f"{where} did not accept your credentials (401 Unauthorized); log in again or "
            "choose another context with --context"
        )
    if code == 403:
        return (
            f"you may not {action}: {message}; ask a cluster admin for access or choose "
            "another context with --context"
        )
    if code == 405:
        return (
            f"{where} does not allow this ({message or reason}); the TrainingJob CRD there may "
            f"be out of date: {CRD_HINT}"
        )
    if resource == "pods" and code >= 500 and _from_kubelet(message):
        return (
            f"could not {action}: the node's kubelet did not answer ({message}); the node may be "
            "down or not reachable from the API server"
        )
    if code in (429, 503, 504):
        return f"{where} is busy or unavailable ({code} {reason}); try again in a moment"
    if code >= 500:
        detail = f": {message}" if message else ""
        return (
            f"{where} failed to {action} ({code} {reason}{detail}); try again, and look at "
            "the API server if it keeps happening"
        )
    return f"could not {action}: {code} {reason}: {message}"


def _from_kubelet(message: str) -> bool:
    """Whether a 5xx on a pod subresource is the apiserver failing to reach the node's kubelet."""
    return any(mark in message for mark in ("/containerLogs/", "kubelet", "dial tcp"))


def _kind_name(plural: str) -> str:
    return {"trainingjobs": "TrainingJob", "pods": "pod", "namespaces": "namespace"}.get(
        plural, plural or "object"
    )


def _innermost(error: BaseException) -> BaseException:
    """urllib3 wraps the socket error in ``MaxRetryError.reason``; dig to the useful one."""
    seen = 0
    while seen < 5:
        inner = getattr(error, "reason", None)
        if not isinstance(inner, BaseException):
            break
        error, seen = inner, seen + 1
    return error


def connection_problem(error: BaseException) -> str:
    """A few words for why a connection failed: refused, timed out, TLS, name lookup."""
    inner = _innermost(error)
    text = f"{type(inner).__name__} {inner}"
    if "SSL" in text or "CERTIFICATE" in text.upper():
        return "its TLS certificate could not be verified against the kubeconfig's CA"
    if isinstance(inner, ConnectionRefusedError) or "Connection refused" in text:
        return "connection refused"
    if "NameResolution" in text or "Name or service not known" in text:
        return "its host name does not resolve"
    if "ConnectTimeout" in text or "timed out" in text.lower():
        return "the connection timed out"
    if "Read" in type(inner).__name__:
        return "it stopped answering"
    return str(inner) or type(inner).__name__


def connection_error(error: BaseException, *, target: Target) -> str:
    """One sentence for a request that never got an HTTP answer."""
    return f"cannot reach {target.where()}: {connection_problem(error)}; {CONTEXT_HINT}"


@contextmanager
def translate(action: str, target: Target, resource: str = "trainingjobs") -> Iterator[None]:
    """Run API calls; re-raise anything the client throws as a :class:`ClientError`.

    ``from None``: the sentence replaces the client's exception, whose traceback would only bury
    it (``--debug`` is not offered because the sentence already names the failing request).
    """
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as error:
        raise ClientError(
            api_error(
                error.status,
                error.body,
                error.reason,
                action=action,
                target=target,
                resource=resource,
            )
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise ClientError(connection_error(error, target=target)) from None
