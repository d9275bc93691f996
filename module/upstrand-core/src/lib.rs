//! Pure logic of the combined-upstreams nginx module.
//!
//! Nothing here touches nginx: the cdylib (`ngx-combined-upstreams`) hands directive arguments in as
//! plain byte strings, gets typed values or an nginx-worded error text back ([`ConfError`]), and
//! applies the result to nginx's structures itself.
//!
//! - [`add_upstream`]: arguments of `add_upstream NAME [backup] [weight=N]` and the copy plan.
//! - [`singlets`]: arguments of `combine_server_singlets`, singlet names and per-singlet flags.
//! - [`extend`]: which fake peers `extend_single_peers` adds.
//! - [`live`]: the live upstream API (`upstreams_api`): request parsing, change plans, answers.
//! - [`plus`]: the NGINX Plus-compatible API (`upstreams_api plus`): routes, answers, writes.
//! - [`upstreams`]: which upstream of nginx's list a name refers to, which ones an upstrand may
//!   use and which ones a walk wraps.
//! - [`upstrand`]: the `upstrand` family (block, walk state machine, variables, `dynamic_upstrand`).

pub mod add_upstream;
pub mod extend;
pub mod live;
pub mod plus;
pub mod singlets;
pub mod upstrand;
pub mod upstreams;

mod error;

pub use error::ConfError;

/// The flags of one `server` entry of an upstream that the module reads or changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerFlags {
    /// `weight=` (nginx stores 0 for a server of an implicit upstream; treated as 1 when copied).
    pub weight: u64,
    /// `backup`
    pub backup: bool,
    /// `down`
    pub down: bool,
}
