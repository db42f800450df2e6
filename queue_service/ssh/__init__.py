"""SSH and SFTP into the hub (docs/source/explanation/contracts.md, contract 9): one listener on `QueueService.ssh_port`
(the shipped config's FGPU_SSH_PORT, default 8022), run by the queue service.

- `ssh -p 8022 ann@hub` opens a shell (or runs a command) inside ann's running default session;
  `ann-<server>@hub` inside a named server's. The password is a hub API token of that user which
  may reach that server (`hub_logins.py`); the shell enters the session's container by the
  engine's exec (`shell.py`, engine/session_exec.py). No running session: a message that says to
  start one on the Sessions page, and a non-zero exit; a session is never started behind the
  user's back. A public key the account keeps (`api/ssh-keys`, store/ssh_keys.py) logs in too.
- `sftp` (and `scp`, which speaks SFTP) reaches the home folder at `/` and the storage folders at
  `/folders/<name>`, session or not, with the Storage page's permissions and quotas and its file
  layer, which never follows a link (`sftp.py`, `file_areas.py`, store/folder_files.py).
- `ssh -L` and `ssh -D` (VS Code's Remote-SSH goes through `-D`) forward connections opened
  from inside the login's running session, by a relay the engine's exec starts there
  (`forwarding.py`): 127.0.0.1 is the session's, and what a session cannot reach (another
  session, the hub's own ports) a forward cannot either. Without a running session a forward is
  refused with the shell's message. No remote forwarding (`-R`), agent or X11 forwarding.
- What a client sends, into a shell or through a forward, is the session's activity for the idle
  culler (`activity.py`): the hub hears the server is in use, as from its JupyterLab.

Why here, in the queue service, rather than a service of its own: SFTP must grant exactly what
the Storage page grants, and that is the queue service's `Folders` (shares, read-only mounts of a
folder past its owner's quota, storage quotas measured and held per owner) and its homes
(`JobFiles.home`); a second process would repeat them or ask for each write over HTTP. The shell
needs the engine's client and the commit locks, which the service holds too. The cost is one
event loop for both: every file call and every engine call of the SSH side runs in a thread, so
a slow disk or a long transfer does not hold the queue's pages and grants.

An address that keeps failing to log in is held back, refused without a check for a growing
while (`login_throttle.py`); the others' logins do not wait behind its checks.

The host key is made once, in the state directory (`host_key.py`); it is a state file that
`fgpu-hub backup` keeps, so clients do not see a new host after a restore.
"""
