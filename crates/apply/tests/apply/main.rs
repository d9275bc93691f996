//! The applier's integration tests, one binary (one link): commands and batch isolation with a
//! fake nginx (`commands`), the journal (`journal`), the live path (`live_push`, `live_reload`),
//! the transaction against a real nginx (`real_nginx`) and restores that never lose the good copy
//! (`restore`). `common` holds the shared helpers.

mod commands;
mod common;
mod journal;
mod live_push;
mod live_reload;
mod real_nginx;
mod restore;
