//! The apply transaction of Tributary: how `<conf dir>/upstreams/<name>.conf` changes safely.
//!
//! - Only changed bytes are written; unchanged bytes mean no write, no test, no reload.
//! - Writes are atomic (temp file in the same folder, fsync, rename); the journal's name and the
//!   new bytes are made durable together before the rename, the rename before the journal goes.
//! - After writing, the test command runs (default `nginx -t`); only if it passes, the reload
//!   command (default `nginx -s reload`), confirmed live by watching the master start new workers
//!   ([`live`]). A failed test puts the previous bytes back (or removes a new file) and records
//!   nginx's own message; a failed or rejected reload restores and tests again.
//! - Restoring renames the journal back over the file (works on a full disk); journals go only
//!   once the restore is durable, and a restore that fails is reported, never called restored.
//! - "Unchanged" means the bytes on disk are the ones nginx has confirmed live.
//! - Changes are applied in batches: one test and one reload for all of them; when the test fails,
//!   the culprits are isolated by bisection and the rest is applied.
//! - The live path ([`Applier::apply_live_batch`]) pushes a change through the caller's
//!   [`Push`] once its journal exists, confirms it once the file is in place, then tests (when
//!   needed); a push whose file cannot be written or whose test fails is taken back.
//! - Reloads keep a minimum gap ([`ApplyOptions::min_reload_gap`], default 2 s).
//! - A lock file (`upstreams/.tributary.lock`, `flock`) keeps a second [`Applier`] out.
//! - A journal of the previous bytes (a hard link to the old file) is made before each change; at [`Applier::open`] a change
//!   left in flight by a crash is tested and restored if nginx fails with it.
//! - Removing a file is refused when nginx fails without it ("remove the include line first").
//!
//! Everything is synchronous and serialised by `&mut self`; the daemon calls it from a blocking task.
//!
//! The modules: `applier` (the transaction; its vocabulary in `applier/outcome.rs`, the stage/undo
//! primitives in `applier/stage.rs`, a batch's steps in `applier/steps.rs`, the live path in
//! `applier/push.rs`, crash recovery in `applier/recovery.rs`: a file recovery restores is not taken
//! as live, so its next change reloads), [`live`] ([`ReloadConfirm`] watches the master from its pid
//! file in `/proc` until every accepting worker is new, and reads nginx's `[emerg]` lines from its
//! error log when the master rejects the configuration) and `nginx` ([`CommandNginx`], argv commands
//! with a timeout; [`discover_reload_paths`] reads `pid`/`error_log` from `TEST_CMD -T` or `nginx
//! -V`). [`Applier::last_steps`] tells how long the write and the test of the last batch took.
#![forbid(unsafe_code)]

mod applier;
mod fsutil;
pub mod live;
mod nginx;

pub use applier::{
    Applier, ApplyError, ApplyOptions, Change, ChangeOutcome, Push, RecoveryReport, ReloadCause,
    ReloadError, RemoveOutcome, StepTimes, UndoError, LOCK_FILE,
};
pub use live::{NotLive, ReloadConfirm, DEFAULT_CONFIRM_TIMEOUT};
pub use nginx::{
    conf_dir_from_nginx_v, discover_reload_paths, main_level_directive, parse_conf_dir,
    parse_nginx_v_path, run_command, CommandError, CommandNginx, Nginx, ReloadPaths,
    DEFAULT_COMMAND_TIMEOUT,
};
