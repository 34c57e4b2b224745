"""Persistent state of the local hub: accounts, tokens, repositories, commits and refs.

Metadata lives in ``root/hub.sqlite`` (stdlib sqlite3), file contents in a
:class:`~hub_export.hub.localhub.objects.BlobStore` under ``root/blobs``. Every write
runs in one ``BEGIN IMMEDIATE`` transaction: SQLite then serializes writers across
threads and processes, so two commits to one branch never lose one another.

Access control is decided in one place, :meth:`LocalHubStore.open_repo`; the
methods that take a :class:`Repo` trust their caller.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hub_export.errors import InputError
from hub_export.hub.localhub.objects import (
    BlobStore,
    Entry,
    Tree,
    commit_oid,
    folders,
    private_dir,
    tree_blobs,
    tree_from_json,
    tree_id,
    tree_to_json,
)
from hub_export.hub.localhub.records import (
    DEFAULT_BRANCH,
    REPO_TYPES,
    AddFile,
    AddLfs,
    Caller,
    Commit,
    CommitResult,
    Delete,
    GcResult,
    HubAPIError,
    Repo,
    entry_not_found,
    now_iso,
    repo_not_found,
    revision_not_found,
    validate_name,
    validate_path,
)
from hub_export.hub.localhub.storage import GITATTRIBUTES, SCHEMA, hash_token, new_token, ref_candidates

# An upload writes its temp file all along: an hour without a write is a dead upload.
TEMP_MIN_AGE = 3600
# An uploaded LFS object waits for its commit, which a large multi-file upload sends hours later.
BLOB_MIN_AGE = 24 * 3600
_OID_RE = re.compile(r"[0-9a-f]{40}")


Operation = AddFile | AddLfs | Delete


class LocalHubStore:
    """All persistent state of one local hub, rooted at ``root``.

    Safe to instantiate many times on one root (each call opens its own SQLite
    connection), from many threads or processes.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        if not self.root.exists():
            private_dir(self.root)
        self.db_path = self.root / "hub.sqlite"
        self._private_database()
        self.blobs = BlobStore(self.root)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
        self.secret = self._load_secret()

    # -- plumbing ---------------------------------------------------------------

    def _private_database(self) -> None:
        """Create the database file owner-only: SQLite gives its -wal and -shm files the same mode."""
        os.close(os.open(self.db_path, os.O_WRONLY | os.O_CREAT, 0o600))
        for path in (self.db_path, self.root / "hub.sqlite-wal", self.root / "hub.sqlite-shm"):
            if path.exists() and path.stat().st_mode & 0o077:
                path.chmod(0o600)  # a database created before files were made private

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.db_path, timeout=60, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            yield db
        finally:
            db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _load_secret(self) -> bytes:
        """The HMAC key signing upload URLs, created once and readable by the owner only."""
        path = self.root / "secret.key"
        if not path.exists():
            tmp = self.root / f"secret.key.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            try:
                os.link(tmp, path)  # atomic create-if-absent: concurrent starts agree on one key
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return bytes.fromhex(path.read_text().strip())

    # -- accounts ---------------------------------------------------------------

    def add_user(self, name: str, *, org: str | None = None, read_only: bool = False) -> str:
        """Create user ``name`` if needed (and ``org``, with the user a write member); return a new token."""
        validate_name(name, "user name")
        if org is not None:
            validate_name(org, "organization name")
        with self._transaction() as db:
            self._ensure_account(db, name, "user")
            if org is not None:
                self._ensure_account(db, org, "org")
                self._set_member(db, org, name, "write")
            return self._issue_token(db, name, read_only)

    def add_org(self, name: str) -> None:
        """Create organization ``name`` (no-op if it exists)."""
        validate_name(name, "organization name")
        with self._transaction() as db:
            self._ensure_account(db, name, "org")

    def add_member(self, org: str, user: str, role: str = "write") -> None:
        """Make ``user`` a member of ``org`` with ``role`` (``read``, ``write`` or ``admin``)."""
        if role not in ("read", "write", "admin"):
            raise InputError(f"Invalid role '{role}': use read, write or admin.")
        with self._transaction() as db:
            org, user = self._existing(db, org, "org"), self._existing(db, user, "user")
            db.execute("INSERT OR REPLACE INTO members VALUES (?, ?, ?)", (org, user, role))

    def issue_token(self, user: str, *, read_only: bool = False) -> str:
        """Issue one more token for an existing user."""
        with self._transaction() as db:
            return self._issue_token(db, self._existing(db, user, "user"), read_only)

    def authenticate(self, token: str) -> Caller | None:
        """The caller a token belongs to, or None for an unknown token."""
        with self._connect() as db:
            row = db.execute("SELECT user, role FROM tokens WHERE hash = ?", (hash_token(token),)).fetchone()
            if row is None:
                return None
            orgs = db.execute("SELECT org, role FROM members WHERE user = ?", (row["user"],)).fetchall()
        return Caller(row["user"], row["role"] == "write", {o["org"]: o["role"] for o in orgs})

    @staticmethod
    def _account(db: sqlite3.Connection, name: str) -> sqlite3.Row | None:
        """The account called ``name`` in any letter case: the Hub has no ``Alice`` beside ``alice``."""
        return db.execute(
            "SELECT name, kind FROM accounts WHERE name = ? COLLATE NOCASE ORDER BY rowid LIMIT 1", (name,)
        ).fetchone()

    def _existing(self, db: sqlite3.Connection, name: str, kind: str) -> str:
        """The canonical spelling of existing account ``name`` of ``kind``; InputError if there is none."""
        row = self._account(db, name)
        if row is None or row["kind"] != kind:
            raise InputError(f"No {'organization' if kind == 'org' else 'user'} named '{name}'.")
        return row["name"]

    def _ensure_account(self, db: sqlite3.Connection, name: str, kind: str) -> None:
        row = self._account(db, name)
        if row is None:
            db.execute("INSERT INTO accounts VALUES (?, ?, ?)", (name, kind, now_iso()))
        elif row["name"] != name:
            raise InputError(f"'{name}' is taken: '{row['name']}' exists and names are case-insensitive.")
        elif row["kind"] != kind:
            raise InputError(f"'{name}' already exists as {'an organization' if row['kind'] == 'org' else 'a user'}.")

    @staticmethod
    def _set_member(db: sqlite3.Connection, org: str, user: str, role: str) -> None:
        # Never downgrade an admin when re-adding a member.
        db.execute("INSERT OR IGNORE INTO members VALUES (?, ?, ?)", (org, user, role))
        db.execute("UPDATE members SET role = ? WHERE org = ? AND user = ? AND role = 'read'", (role, org, user))

    @staticmethod
    def _issue_token(db: sqlite3.Connection, user: str, read_only: bool) -> str:
        token = new_token()
        role = "read" if read_only else "write"
        db.execute("INSERT INTO tokens VALUES (?, ?, ?, ?)", (hash_token(token), user, role, now_iso()))
        return token

    # -- access -----------------------------------------------------------------

    @staticmethod
    def can_read(caller: Caller | None, repo: Repo) -> bool:
        """Public repos are world-readable; private ones only by their namespace and its members."""
        return not repo.private or LocalHubStore.in_namespace(caller, repo.namespace)

    @staticmethod
    def require_writer(caller: Caller | None, namespace: str, what: str) -> None:
        """Raise 401/403 unless ``caller`` holds a write token for ``namespace``."""
        if caller is None:
            raise HubAPIError(401, f"You must be authenticated to {what}: pass a token.")
        if not caller.can_write:
            raise HubAPIError(403, f"Your token is read-only: it cannot {what}")
        if caller.name != namespace and caller.orgs.get(namespace) not in ("write", "admin"):
            raise HubAPIError(403, f"You don't have the rights to {what} (namespace '{namespace}')")

    def open_repo(
        self, caller: Caller | None, repo_type: str, namespace: str, name: str, *, write: bool = False
    ) -> Repo:
        """The repo if ``caller`` may read it (and write it when ``write``); 404 hides private repos."""
        repo = self.find_repo(repo_type, namespace, name)
        if repo is None or not self.can_read(caller, repo):
            raise repo_not_found()
        if write:
            self.require_writer(caller, repo.namespace, f"write to {repo.repo_id}")
        return repo

    # -- gated repositories ------------------------------------------------------

    def gate(self, repo: Repo) -> str | None:
        """``"auto"`` or ``"manual"`` when downloading ``repo``'s files needs granted access, else None."""
        with self._connect() as db:
            row = db.execute("SELECT mode FROM gates WHERE repo = ?", (repo.id,)).fetchone()
        return row["mode"] if row else None

    def set_gate(self, repo: Repo, mode: str | None) -> None:
        """Gate ``repo`` (``"auto"``/``"manual"``, as the Hub's settings call names it) or ungate it (None)."""
        if mode not in (None, "auto", "manual"):
            raise HubAPIError(400, f"gated must be false, 'auto' or 'manual', not {mode!r}")
        with self._transaction() as db:
            db.execute("DELETE FROM gates WHERE repo = ?", (repo.id,))
            if mode:
                db.execute("INSERT INTO gates (repo, mode) VALUES (?, ?)", (repo.id, mode))

    def grant_access(self, repo: Repo, user: str) -> None:
        """Let ``user`` download ``repo``'s files (what accepting the conditions does on the Hub)."""
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO gate_access (repo, user) VALUES (?, ?)", (repo.id, user))

    def require_file_access(self, caller: Caller | None, repo: Repo) -> None:
        """Raise the Hub's ``GatedRepo`` error unless ``caller`` may download ``repo``'s files."""
        if self.gate(repo) is None or self.in_namespace(caller, repo.namespace):
            return
        if caller is None:
            raise HubAPIError(
                401,
                f"Access to model {repo.repo_id} is restricted. You must have access to it and be authenticated "
                "to access it. Please log in.",
                "GatedRepo",
            )
        with self._connect() as db:
            granted = db.execute(
                "SELECT 1 FROM gate_access WHERE repo = ? AND user = ?", (repo.id, caller.name)
            ).fetchone()
        if not granted:
            raise HubAPIError(
                403,
                f"Access to model {repo.repo_id} is restricted and you are not in the authorized list. "
                f"Visit {repo.url_path} to ask for access.",
                "GatedRepo",
            )

    @staticmethod
    def in_namespace(caller: Caller | None, namespace: str) -> bool:
        """Whether ``caller`` is ``namespace`` or one of its organization's members."""
        return caller is not None and (caller.name == namespace or namespace in caller.orgs)

    # -- repositories -----------------------------------------------------------

    def find_repo(self, repo_type: str, namespace: str, name: str) -> Repo | None:
        """The repo ``namespace/name`` in any letter case, as the Hub resolves ``alice/PUB`` to ``alice/pub``."""
        with self._connect() as db:
            row = self._find_repo(db, repo_type, namespace, name)
        return _repo(row) if row else None

    @staticmethod
    def _find_repo(db: sqlite3.Connection, repo_type: str, namespace: str, name: str) -> sqlite3.Row | None:
        return db.execute(
            "SELECT * FROM repos WHERE type = ? AND namespace = ? COLLATE NOCASE AND name = ? COLLATE NOCASE"
            " ORDER BY id LIMIT 1",
            (repo_type, namespace, name),
        ).fetchone()

    def list_repos(self, caller: Caller | None, repo_type: str, author: str | None = None) -> list[Repo]:
        """Repos of ``repo_type`` visible to ``caller``, optionally limited to one namespace."""
        query, args = "SELECT * FROM repos WHERE type = ?", [repo_type]
        if author:
            query, args = query + " AND namespace = ? COLLATE NOCASE", [*args, author]
        with self._connect() as db:
            repos = [_repo(r) for r in db.execute(query + " ORDER BY namespace, name", args)]
        return [r for r in repos if self.can_read(caller, r)]

    def create_repo(
        self, caller: Caller | None, repo_type: str, namespace: str, name: str, *, private: bool = False
    ) -> tuple[Repo, bool]:
        """Create a repo with the Hub's initial commit; return ``(repo, created)``.

        ``created`` is False when it already existed (the server answers 409).
        """
        if repo_type not in REPO_TYPES:
            raise InputError(f"Invalid repo type '{repo_type}': use one of {', '.join(REPO_TYPES)}.")
        validate_name(namespace, "namespace")
        validate_name(name)
        with self._connect() as db:
            account = self._account(db, namespace)
        namespace = account["name"] if account else namespace  # canonical spelling: "ALICE" creates under "alice"
        self.require_writer(caller, namespace, f"create a {repo_type} under this namespace")
        assert caller is not None
        with self._transaction() as db:
            row = self._find_repo(db, repo_type, namespace, name)
            if row is not None:
                return _repo(row), False
            created_at = now_iso()
            cursor = db.execute(
                "INSERT INTO repos (type, namespace, name, private, created_at) VALUES (?, ?, ?, ?, ?)",
                (repo_type, namespace, name, int(private), created_at),
            )
            repo = Repo(int(cursor.lastrowid or 0), repo_type, namespace, name, private, created_at)
            tree = {".gitattributes": Entry.regular(GITATTRIBUTES)}
            self.blobs.put(GITATTRIBUTES)
            oid = self._write_commit(db, repo, None, tree, caller.name, "initial commit", "")
            db.execute("INSERT INTO refs VALUES (?, ?, ?)", (repo.id, f"refs/heads/{DEFAULT_BRANCH}", oid))
        return repo, True

    def delete_repo(self, repo: Repo) -> None:
        """Forget a repo and everything keyed by its id: SQLite gives a later repo the same id.

        Blobs stay on disk (they may be shared); :meth:`gc` removes those nothing refers to.
        """
        with self._transaction() as db:
            db.execute("DELETE FROM repos WHERE id = ?", (repo.id,))
            self._forget_orphans(db)

    @staticmethod
    def _forget_orphans(db: sqlite3.Connection) -> None:
        """Delete rows of repos that no longer exist (a gate or grant must not pass to a reused id)."""
        for table in ("refs", "commits", "repo_objects", "gates", "gate_access"):
            db.execute(f"DELETE FROM {table} WHERE repo NOT IN (SELECT id FROM repos)")

    def set_private(self, repo: Repo, private: bool) -> None:
        with self._transaction() as db:
            db.execute("UPDATE repos SET private = ? WHERE id = ?", (int(private), repo.id))

    # -- revisions and trees ----------------------------------------------------

    def resolve(self, repo: Repo, rev: str) -> Commit:
        """Branch, tag, ``refs/...`` name or full commit id -> commit; 404 RevisionNotFound otherwise."""
        with self._connect() as db:
            return self._resolve(db, repo, rev)

    def tree(self, commit: Commit) -> Tree:
        with self._connect() as db:
            return self._tree(db, commit.tree)

    def history(self, repo: Repo, rev: str) -> list[Commit]:
        """Commits reachable from ``rev``, newest first."""
        with self._connect() as db:
            commits = [self._resolve(db, repo, rev)]
            while commits[-1].parent:
                parent = self._commit(db, repo, commits[-1].parent)
                if parent is None:
                    break
                commits.append(parent)
        return commits

    def refs(self, repo: Repo) -> dict[str, str]:
        """``{"refs/heads/main": oid, "refs/tags/v1": oid, "refs/pr/1": oid, ...}``."""
        with self._connect() as db:
            rows = db.execute("SELECT name, target FROM refs WHERE repo = ? ORDER BY name", (repo.id,)).fetchall()
        return {r["name"]: r["target"] for r in rows}

    def create_ref(self, repo: Repo, ref: str, starting_point: str) -> None:
        """Create ``ref`` (``refs/heads/x`` or ``refs/tags/x``) at ``starting_point``; 409 if it exists."""
        name = ref.split("/", 2)[2]
        if not name or any(p in ("", ".", "..") for p in name.split("/")) or not re.fullmatch(r"[\w./-]+", name):
            raise InputError(f"Invalid reference name '{name}'.")
        with self._transaction() as db:
            target = self._resolve(db, repo, starting_point).oid
            if db.execute("SELECT 1 FROM refs WHERE repo = ? AND name = ?", (repo.id, ref)).fetchone():
                raise HubAPIError(409, f"Reference already exists: {ref}")
            db.execute("INSERT INTO refs VALUES (?, ?, ?)", (repo.id, ref, target))

    def delete_ref(self, repo: Repo, ref: str) -> None:
        if ref == f"refs/heads/{DEFAULT_BRANCH}":
            raise HubAPIError(403, f"Cannot delete the default branch '{DEFAULT_BRANCH}'")
        with self._transaction() as db:
            if db.execute("DELETE FROM refs WHERE repo = ? AND name = ?", (repo.id, ref)).rowcount == 0:
                raise revision_not_found(ref)

    def read_blob(self, entry: Entry) -> bytes:
        return self.blobs.path(entry.sha256).read_bytes()

    # -- LFS objects ------------------------------------------------------------

    def object_size(self, repo: Repo, sha256: str) -> int | None:
        """Size of LFS object ``sha256`` if it was uploaded to ``repo`` and is on disk, else None."""
        with self._connect() as db:
            return self._object_size(db, repo, sha256)

    def touch_object(self, sha256: str) -> None:
        """A client was told the object is stored and will commit it: keep gc off it for a while."""
        self.blobs.touch(sha256)

    def add_object(self, repo: Repo, sha256: str, size: int) -> None:
        """Record that a verified upload of ``sha256`` belongs to ``repo``."""
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO objects VALUES (?, ?)", (sha256, size))
            db.execute("INSERT OR IGNORE INTO repo_objects VALUES (?, ?)", (repo.id, sha256))

    def _object_size(self, db: sqlite3.Connection, repo: Repo, sha256: str) -> int | None:
        row = db.execute(
            "SELECT o.size FROM repo_objects r JOIN objects o ON o.sha256 = r.sha256 WHERE r.repo = ? AND r.sha256 = ?",
            (repo.id, sha256),
        ).fetchone()
        return row["size"] if row and self.blobs.has(sha256) else None

    # -- garbage collection -------------------------------------------------------

    def gc(self, min_age: float = BLOB_MIN_AGE) -> GcResult:
        """Remove upload temp files and blobs no commit refers to, once older than their grace period.

        Age is what protects work in flight: uploads keep writing their temp file, and a
        blob about to be committed is touched when it is stored or found already stored
        (:meth:`BlobStore.touch`). Temp files go after ``min(min_age, TEMP_MIN_AGE)``.
        """
        now = time.time()
        temp = self.blobs.sweep_temp(now - min(min_age, TEMP_MIN_AGE))
        with self._transaction() as db:
            self._forget_orphans(db)
            db.execute("DELETE FROM trees WHERE id NOT IN (SELECT tree FROM commits)")
            live: set[str] = set()
            for row in db.execute("SELECT entries FROM trees"):
                live |= tree_blobs(row["entries"])
        blobs, removed = self.blobs.sweep(live, now - min_age)
        with self._transaction() as db:
            gone = [(sha,) for sha in removed if not self.blobs.has(sha)]  # not uploaded again meanwhile
            db.executemany("DELETE FROM repo_objects WHERE sha256 = ?", gone)
            db.executemany("DELETE FROM objects WHERE sha256 = ?", gone)
        return GcResult(temp, blobs)

    # -- commits ----------------------------------------------------------------

    def commit(
        self,
        repo: Repo,
        author: str,
        rev: str,
        operations: list[Operation],
        *,
        summary: str,
        description: str = "",
        parent_commit: str | None = None,
        create_pr: bool = False,
    ) -> CommitResult:
        """Apply ``operations`` on top of branch (or PR ref) ``rev``.

        A stale ``parent_commit`` is refused with 412. A commit that leaves the tree
        unchanged creates nothing and returns the current head. With ``create_pr``,
        the result lands on a new ``refs/pr/N`` instead of ``rev``.
        """
        ref = rev if rev.startswith("refs/") else f"refs/heads/{rev}"
        if not ref.startswith(("refs/heads/", "refs/pr/")):
            raise InputError(f"Cannot commit to '{rev}': only branches and pull requests accept commits.")
        with self._transaction() as db:
            row = db.execute("SELECT target FROM refs WHERE repo = ? AND name = ?", (repo.id, ref)).fetchone()
            if row is None:
                raise revision_not_found(rev)
            head = row["target"]
            base = head
            if parent_commit is not None and parent_commit != head:
                if not create_pr:
                    raise HubAPIError(412, "A commit has happened since. Please refresh and try again.")
                if self._commit(db, repo, parent_commit) is None:
                    raise revision_not_found(parent_commit)
                base = parent_commit
            base_commit = self._commit(db, repo, base)
            assert base_commit is not None
            tree = self._tree(db, base_commit.tree)
            new_tree = self._apply(db, repo, tree, operations)
            created = new_tree != tree
            oid = self._write_commit(db, repo, base, new_tree, author, summary, description) if created else base
            pr_num = None
            if create_pr:
                pr_num = self._next_pr(db, repo)
                ref = f"refs/pr/{pr_num}"
            if created or create_pr:
                db.execute("INSERT OR REPLACE INTO refs VALUES (?, ?, ?)", (repo.id, ref, oid))
        return CommitResult(oid, pr_num, created)

    def _apply(self, db: sqlite3.Connection, repo: Repo, tree: Tree, operations: list[Operation]) -> Tree:
        new = dict(tree)
        for op in operations:
            if isinstance(op, AddFile):
                new[validate_path(op.path)] = op.entry
            elif isinstance(op, AddLfs):
                size = self._object_size(db, repo, op.sha256)
                if size is None:
                    raise HubAPIError(
                        422, f"LFS object {op.sha256} for '{op.path}' was never uploaded to {repo.repo_id}"
                    )
                if op.size is not None and op.size != size:
                    raise HubAPIError(422, f"LFS object {op.sha256} has {size} bytes, not {op.size}")
                new[validate_path(op.path)] = Entry.large(op.sha256, size)
            elif op.folder:
                prefix = op.path.strip("/") + "/"
                doomed = [p for p in new if p.startswith(prefix)]
                if not doomed:
                    raise entry_not_found(f"A folder with this name doesn't exist: {op.path}")
                for path in doomed:
                    del new[path]
            elif new.pop(op.path, None) is None:
                raise entry_not_found(f"A file with this name doesn't exist: {op.path}")
        clashes = folders(new) & new.keys()
        if clashes:
            raise InputError(f"A path is both a file and a folder: {sorted(clashes)[0]}")
        return new

    def _write_commit(
        self, db: sqlite3.Connection, repo: Repo, parent: str | None, tree: Tree, author: str, title: str, message: str
    ) -> str:
        tid = tree_id(tree)
        db.execute("INSERT OR IGNORE INTO trees VALUES (?, ?)", (tid, tree_to_json(tree)))
        date = now_iso()
        oid = commit_oid(tree=tid, parent=parent, author=author, date=date, summary=title, description=message)
        db.execute(
            "INSERT OR IGNORE INTO commits VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (repo.id, oid, parent, tid, author, date, title, message),
        )
        return oid

    @staticmethod
    def _next_pr(db: sqlite3.Connection, repo: Repo) -> int:
        rows = db.execute("SELECT name FROM refs WHERE repo = ? AND name LIKE 'refs/pr/%'", (repo.id,)).fetchall()
        return max((int(r["name"].rsplit("/", 1)[1]) for r in rows), default=0) + 1

    def _resolve(self, db: sqlite3.Connection, repo: Repo, rev: str) -> Commit:
        for ref in ref_candidates(rev):
            row = db.execute("SELECT target FROM refs WHERE repo = ? AND name = ?", (repo.id, ref)).fetchone()
            if row is not None:
                commit = self._commit(db, repo, row["target"])
                if commit is not None:
                    return commit
        if _OID_RE.fullmatch(rev):
            commit = self._commit(db, repo, rev)
            if commit is not None:
                return commit
        raise revision_not_found(rev)

    @staticmethod
    def _commit(db: sqlite3.Connection, repo: Repo, oid: str) -> Commit | None:
        row = db.execute(
            "SELECT oid, parent, tree, author, date, title, message FROM commits WHERE repo = ? AND oid = ?",
            (repo.id, oid),
        ).fetchone()
        return Commit(*row) if row else None

    @staticmethod
    def _tree(db: sqlite3.Connection, tid: str) -> Tree:
        row = db.execute("SELECT entries FROM trees WHERE id = ?", (tid,)).fetchone()
        return tree_from_json(row["entries"])


def _repo(row: sqlite3.Row) -> Repo:
    return Repo(row["id"], row["type"], row["namespace"], row["name"], bool(row["private"]), row["created_at"])


def add_user(root: str | Path, name: str, org: str | None = None, read_only: bool = False) -> str:
    """Create user ``name`` under ``root`` (and ``org``, user as write member); return a new token."""
    return LocalHubStore(root).add_user(name, org=org, read_only=read_only)


def add_org(root: str | Path, name: str) -> None:
    """Create organization ``name`` under ``root``."""
    LocalHubStore(root).add_org(name)


def add_member(root: str | Path, org: str, user: str, role: str = "write") -> None:
    """Make ``user`` a member of ``org`` with ``role``."""
    LocalHubStore(root).add_member(org, user, role)
