"""Whose process a rank is: the Unix account a job runs as on this node, and the files it owns.

The server names the account in each ``Assignment`` (``run_as``): the one mapped to the job's gsched
user (``gsched user add NAME --unix-user ACCOUNT``), or None for the agent's own account (the built-in
workload, and every job in the server's single-team mode, ``run_as_agent_user = true``).

* An agent running as root switches to the account (uid, gid and its supplementary groups) before
  the rank's program starts (``subprocess.Popen(user=, group=, extra_groups=)``), and hands it the
  rank's directories (``own``); nobody else can read them.
* An agent not running as root can run jobs only as its own account: ``resolve`` refuses any other,
  saying so, and the rank fails with that reason.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path

NO_MAPPING = ""  # what the server sends for a job whose user has no account (and no single-team mode)


class AccountError(RuntimeError):
    """The job cannot run as its account on this node (unknown here, or not this agent's to switch to)."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str
    switch: bool  # the agent (root) must switch to it; False: the rank runs as the agent itself

    def env(self) -> dict[str, str]:
        """HOME, USER, LOGNAME and SHELL of the account, when the rank runs as another one than the agent."""
        if not self.switch:
            return {}
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell or "/bin/sh"}


def _account(entry: pwd.struct_passwd, switch: bool) -> Account:
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, entry.pw_shell, switch)


def agent_account() -> Account:
    """The account this agent runs as."""
    uid = os.geteuid()
    try:
        return _account(pwd.getpwuid(uid), False)
    except KeyError:  # a uid without a passwd entry (containers)
        return Account(str(uid), uid, os.getegid(), tuple(os.getgroups()), os.environ.get("HOME", "/"), "/bin/sh", False)


def resolve(run_as: str | None, node: str, user: str = "") -> Account:
    """The account a rank of ``user``'s job runs as on ``node``; raises ``AccountError`` saying why not."""
    me = agent_account()
    if run_as is None:
        return me
    if run_as == NO_MAPPING:
        raise AccountError(f"gsched user {user or '?'} has no Unix account to run as (an admin sets one with "
                           f"`gsched user set {user or 'NAME'} --unix-user ACCOUNT`)")
    try:
        entry = pwd.getpwnam(run_as)
    except KeyError:
        raise AccountError(f"there is no Unix account {run_as!r} on node {node}") from None
    if entry.pw_uid == me.uid:
        return _account(entry, False)
    if entry.pw_uid == 0:
        raise AccountError(f"node {node} will not run a job as {run_as!r} (uid 0)")
    if me.uid != 0:
        raise AccountError(f"the agent on node {node} runs as {me.name}, not root: it can run jobs only as "
                           f"{me.name}, and this one is to run as {run_as} (run the agent as root, or the "
                           f"server in single-team mode: run_as_agent_user = true)")
    return _account(entry, True)


def own(path: Path, account: Account, mode: int) -> None:
    """Give ``path`` to ``account`` with ``mode`` (0o700: nobody else may read it)."""
    if account.switch:
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
    if not path.is_symlink():
        os.chmod(path, mode)


def share(path: Path, account: Account, mode: int) -> None:
    """Keep ``path`` the agent's but let ``account``'s group read it (0o750 / 0o640): files the job may
    read and must not change, such as the mirrored checkpoints it resumes from."""
    if account.switch:
        os.chown(path, -1, account.gid, follow_symlinks=False)
    if not path.is_symlink():
        os.chmod(path, mode)
