"""Which isolation tier jobs run under: chosen once per process, stated, never downgraded silently.

The configured tier (`sandbox.tier` / ELR_SANDBOX_TIER, default bwrap) is probed
by running a real job; if it cannot run, `SandboxUnavailable` says what to
install, unless a weaker tier is accepted (`sandbox.allow_weaker_tier` /
ELR_SANDBOX_ALLOW_WEAKER_TIER=1), which is logged as a warning.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from dataclasses import dataclass

log = logging.getLogger("environments.sandbox")
TIERS = ("bwrap", "unshare", "rlimit")


class SandboxUnavailable(RuntimeError):
    """The configured isolation tier cannot run on this machine."""



def _probe(tier: str) -> str | None:
    """None when `tier` runs a job here, else why not."""
    from environments import sandbox

    sb = None
    try:
        sb = sandbox.Sandbox(tier=tier, limits=sandbox.SandboxLimits(wall_s=10.0))
        res = sb.run([sandbox.sandbox_python(), "-I", "-S", "-c", "open('probe', 'w').write('ok'); print(open('probe').read())"])
        if res.stdout.strip() == "ok" and res.returncode == 0:
            return None
        return f"exit {res.returncode}: {res.stderr.strip()[-300:] or res.stdout.strip()[-300:]}"
    except (OSError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        if sb is not None:
            sb.close()


def _tier_ok(tier: str) -> str | None:
    exe = {"bwrap": "bwrap", "unshare": "unshare"}.get(tier)
    if exe and not shutil.which(exe):
        return f"`{exe}` is not installed"
    return _probe(tier)


_INSTALL_HINT = {
    "bwrap": "install bubblewrap (scripts/install_system_deps.sh, or `apt-get install bubblewrap`)",
    "unshare": "install util-linux and allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)",
    "rlimit": "check that a Python interpreter is executable by the sandbox user",
}


def configured_tier() -> tuple[str, bool]:
    """(tier asked for, whether a weaker one is accepted) from ELR_SANDBOX_TIER / ELR_SANDBOX_ALLOW_WEAKER_TIER."""
    tier = os.environ.get("ELR_SANDBOX_TIER") or TIERS[0]
    if tier not in TIERS:
        raise ValueError(f"ELR_SANDBOX_TIER={tier!r}; choose one of {TIERS}")
    return tier, os.environ.get("ELR_SANDBOX_ALLOW_WEAKER_TIER", "0").lower() in ("1", "true", "yes")


@dataclass
class SandboxConfig:
    """Isolation of model-written code (environments/sandbox.py); the tier in force is printed at start."""

    tier: str = "bwrap"
    """Tier jobs must run under: bwrap (bubblewrap: the job sees only system programs, the interpreter's standard
    library and its own folder), unshare (namespaces, the host's other top-level folders covered), rlimit (limits
    only: network open, host files readable). A tier that cannot run stops the command with what to install."""
    allow_weaker_tier: bool = False
    """Accept the strongest weaker tier that runs when `tier` cannot (printed at start and recorded in the run's
    summary.json); off: no silent downgrade."""

    def validate(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"config field `sandbox.tier`: got {self.tier!r}; choose one of {', '.join(TIERS)}")

    def apply(self) -> str:
        """Fix the tier for this process and the processes it starts; the tier in force (raises if none may run)."""
        self.validate()
        configure(self.tier, self.allow_weaker_tier)
        return detect_tier()

    def require_for(self, envs) -> str | None:
        """`apply()` when any of `envs` (environment instances or classes) runs model output in the sandbox,
        so that a command stops before any engine starts if the tier cannot run; else None."""
        if not any(getattr(e, "sandboxed", False) for e in envs):
            return None
        tier = self.apply()
        log.warning("sandbox tier: %s (configured %s, allow_weaker_tier=%s)", tier, self.tier, self.allow_weaker_tier)
        return tier


# What fixes a process's sandbox (tier, folder, cgroups, user): actors started elsewhere (a remote Ray node)
# get them in their runtime env, so every process of a run sandboxes the same way.
SANDBOX_ENV_VARS = ("ELR_SANDBOX_TIER", "ELR_SANDBOX_ALLOW_WEAKER_TIER", "ELR_SANDBOX_DIR", "ELR_SANDBOX_CGROUP",
                    "ELR_SANDBOX_UID")


def configure(tier: str, allow_weaker_tier: bool) -> None:
    """Set the tier for this process and the workers it starts (they inherit the environment)."""
    if tier not in TIERS:
        raise ValueError(f"sandbox.tier={tier!r}; choose one of {TIERS}")
    os.environ["ELR_SANDBOX_TIER"] = tier
    os.environ["ELR_SANDBOX_ALLOW_WEAKER_TIER"] = "1" if allow_weaker_tier else "0"
    detect_tier.cache_clear()


@functools.cache
def detect_tier() -> str:
    """The tier jobs run under, chosen once: the configured one, or an error saying what to do.

    A weaker tier replaces it only when allowed, and that is logged as a warning."""
    wanted, allow_weaker = configured_tier()
    why = _tier_ok(wanted)
    if why is None:
        log.info("sandbox tier: %s", wanted)
        return wanted
    if allow_weaker:
        for tier in TIERS[TIERS.index(wanted) + 1 :]:
            if _tier_ok(tier) is None:
                log.warning("sandbox: tier %s cannot run (%s); using the weaker tier %s (allow_weaker_tier)", wanted, why, tier)
                return tier
    raise SandboxUnavailable(
        f"sandbox tier {wanted!r} cannot run here ({why}): {_INSTALL_HINT[wanted]}, or choose a weaker tier with "
        f"sandbox.tier / ELR_SANDBOX_TIER, or accept one with sandbox.allow_weaker_tier=true / ELR_SANDBOX_ALLOW_WEAKER_TIER=1"
    )


def available_tiers() -> list[str]:
    """Every tier that works here (for tests that exercise each one)."""
    return [t for t in TIERS if _tier_ok(t) is None]
