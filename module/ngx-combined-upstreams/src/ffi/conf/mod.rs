//! The configuration side of the seam: [`ConfExt`]'s implementation (a safe extension of
//! `ngx_conf_t` for directive handlers and configuration hooks: the directive's words, the
//! configuration pool, configuration log lines and the handler result), the directive and
//! configuration-hook trampolines ([`Directive`], [`HttpHooks`], [`module_ctx`]), the module
//! object ([`ModuleObject`]), a block's directives ([`parse_block`]), nginx's regular
//! expressions ([`Regex`]), a directive's handler run on scratch configurations for `probe.rs`
//! ([`call_directive`]) and a new `upstream {}` block ([`create`]). The traits are declared in
//! `parts.rs` (safe code).
//!
//! A `&ngx_conf_t` / `&mut ngx_conf_t` exists only inside a call from nginx (a trampoline turns
//! its raw pointer into a reference once), so the fields these methods read are nginx's: `args`
//! is the parser's array of `ngx_str_t`, `pool` the live configuration pool, `log` the
//! configuration log.

mod parts;

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_void, CStr};
use core::mem::{self, size_of, zeroed};
use core::ptr::{self, NonNull};
use core::slice;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_array_create, ngx_array_t, ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_http_conf_ctx_t,
    ngx_http_max_module, ngx_http_module_t, ngx_http_upstream_add, ngx_http_upstream_init_pt,
    ngx_http_upstream_module, ngx_http_upstream_server_t, ngx_http_upstream_srv_conf_t, ngx_int_t,
    ngx_module_t, ngx_pcalloc, ngx_regex_compile, ngx_regex_compile_t, ngx_regex_exec, ngx_regex_t,
    ngx_str_t, ngx_url_t, NGX_HTTP_MODULE, NGX_HTTP_UPSTREAM_BACKUP, NGX_HTTP_UPSTREAM_CREATE,
    NGX_HTTP_UPSTREAM_DOWN, NGX_HTTP_UPSTREAM_FAIL_TIMEOUT, NGX_HTTP_UPSTREAM_MAX_CONNS,
    NGX_HTTP_UPSTREAM_MAX_FAILS, NGX_HTTP_UPSTREAM_WEIGHT, NGX_LOG_EMERG, NGX_MAX_CONF_ERRSTR,
};
use ngx::http::{HttpModule, Merge, NgxHttpUpstreamModule};

use super::log::{conf_log, log_str};
use super::pool::{self, add_cleanup, alloc, alloc_box, copy_str};
use super::upstream::Upstream;
use super::{borrowed, bytes, ConfFail, Status};

use super::pool::Cleanup;
pub use parts::{Block, ConfExt, ConfPart, Directive, HttpHooks};

/// The trampoline nginx calls for a directive of handler `D`.
pub(super) extern "C" fn directive<D: Directive>(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx calls a directive handler with the configuration being parsed; nothing else
    // refers to it during the call.
    let cf = unsafe { &mut *cf };
    let result = D::handle(cf);
    cf.result(result)
}

/// nginx's hook table for `M`.
pub const fn module_ctx<M>() -> ngx_http_module_t
where
    M: HttpHooks,
    M::MainConf: Default + 'static,
    M::ServerConf: Default + 'static,
    M::LocationConf: Default + Merge + 'static,
{
    ngx_http_module_t {
        preconfiguration: Some(preconfiguration::<M>),
        postconfiguration: Some(postconfiguration::<M>),
        create_main_conf: Some(create_main_conf::<M>),
        init_main_conf: Some(init_main_conf::<M>),
        create_srv_conf: Some(create_plain::<M::ServerConf>),
        merge_srv_conf: None,
        create_loc_conf: Some(create_boxed::<M::LocationConf>),
        // The `ngx` crate's: `Merge::merge(child, parent)` on the two location confs.
        merge_loc_conf: Some(<M as HttpModule>::merge_loc_conf),
    }
}

extern "C" fn preconfiguration<M: HttpHooks>(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: nginx calls the hook with the configuration being parsed; nothing else holds a
    // reference to it during the call.
    <M as HttpHooks>::preconfiguration(unsafe { &mut *cf }).into()
}

extern "C" fn postconfiguration<M: HttpHooks>(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: as for preconfiguration.
    <M as HttpHooks>::postconfiguration(unsafe { &mut *cf }).into()
}

extern "C" fn init_main_conf<M: HttpHooks>(cf: *mut ngx_conf_t, _conf: *mut c_void) -> *mut c_char {
    // SAFETY: as for preconfiguration.
    let cf = unsafe { &mut *cf };
    let result = <M as HttpHooks>::init_main_conf(cf);
    cf.result(result)
}

/// The `create_main_conf` hook: [`HttpHooks::main_conf_begins`], then the main configuration
/// (null when either fails).
extern "C" fn create_main_conf<M>(cf: *mut ngx_conf_t) -> *mut c_void
where
    M: HttpHooks,
    M::MainConf: Default + 'static,
{
    // SAFETY: nginx calls the hook with the configuration being parsed; nothing else refers to
    // it during the call.
    if <M as HttpHooks>::main_conf_begins(unsafe { &mut *cf }).is_err() {
        return ptr::null_mut();
    }
    create_boxed::<M::MainConf>(cf)
}

/// A `create_*_conf` hook for a value dropped with the configuration pool (null when out of
/// memory).
extern "C" fn create_boxed<T: Default + 'static>(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx calls the hook with the configuration being parsed.
    let cf = unsafe { &*cf };
    cf.alloc_box(T::default())
        .map_or(ptr::null_mut(), |c| ptr::from_mut(c).cast())
}

/// A `create_*_conf` hook for plain data (null when out of memory).
extern "C" fn create_plain<T: Default + 'static>(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx calls the hook with the configuration being parsed.
    let cf = unsafe { &*cf };
    cf.alloc(T::default())
        .map_or(ptr::null_mut(), |c| ptr::from_mut(c).cast())
}

/// The module object nginx loads (`ngx_module_t`, which nginx writes while loading modules:
/// `index`, `ctx_index`), as a static without `static mut`.
#[repr(transparent)]
pub struct ModuleObject(UnsafeCell<ngx_module_t>);

// SAFETY: nginx writes the object only while loading modules, single-threaded, before any code
// of this module reads it; nginx processes are single-threaded.
unsafe impl Sync for ModuleObject {}

impl ModuleObject {
    /// The object with these contents.
    pub const fn new(m: ngx_module_t) -> ModuleObject {
        ModuleObject(UnsafeCell::new(m))
    }

    /// The address nginx gets (`ngx_modules`).
    pub const fn as_ptr(&self) -> *const ngx_module_t {
        self.0.get()
    }

    /// The object, for the `ngx` crate's `HttpModule::module`.
    pub fn get(&'static self) -> &'static ngx_module_t {
        // SAFETY: see the Sync impl: once this module's code runs, nginx no longer writes it.
        unsafe { &*self.0.get() }
    }
}

/// The type the module keeps in its requests' context slot.
///
/// # Safety
/// One type of the module implements it, and `module` is this module's object.
pub unsafe trait RequestCtx: Copy + 'static {
    /// The module whose slot holds it.
    fn module() -> &'static ngx_module_t;
}

impl ConfExt for ngx_conf_t {
    fn args(&self) -> Vec<&[u8]> {
        if self.args.is_null() {
            return Vec::new();
        }
        // SAFETY: cf->args is nginx's array of ngx_str_t for the directive being parsed; its
        // strings live in the configuration pool for the whole parse, longer than &self.
        unsafe {
            let a = &*self.args;
            if a.nelts == 0 || a.elts.is_null() {
                return Vec::new();
            }
            let elts = slice::from_raw_parts(a.elts as *const ngx_str_t, a.nelts);
            elts.iter().map(|s| bytes(s)).collect()
        }
    }

    fn copy_str(&self, data: &[u8]) -> Option<ngx_str_t> {
        // SAFETY: self.pool is the live configuration pool.
        copy_str(&unsafe { pool::pool(self.pool) }, data)
    }

    fn alloc<T>(&self, value: T) -> Option<&'static mut T> {
        // SAFETY: self.pool is the live configuration pool, which outlives every use of the
        // configuration (the cycle); the memory is fresh, so the reference is unique.
        unsafe { alloc(&pool::pool(self.pool), value).map(|mut p| p.as_mut()) }
    }

    fn alloc_box<T>(&self, value: T) -> Option<&'static mut T> {
        // SAFETY: as for `alloc`; the pool's cleanup drops the value with the pool.
        unsafe { alloc_box(&pool::pool(self.pool), value).map(|mut p| p.as_mut()) }
    }

    fn on_cleanup<C: Cleanup>(&self, data: usize) -> bool {
        // SAFETY: self.pool is the live configuration pool.
        add_cleanup::<C>(&unsafe { pool::pool(self.pool) }, data)
    }

    fn log(&self, level: u32, msg: &str) {
        conf_log(self, level, msg);
    }

    fn log_plain(&self, level: u32, msg: &str) {
        // SAFETY: cf->log is the live configuration log while the configuration is parsed.
        if let Some(log) = unsafe { self.log.as_ref() } {
            log_str(log, level, msg);
        }
    }

    fn result(&self, result: Result<(), ConfFail>) -> *mut c_char {
        match result {
            Ok(()) => NGX_CONF_OK,
            Err(ConfFail::Conf(e)) => {
                self.log(NGX_LOG_EMERG, &e.to_string());
                NGX_CONF_ERROR
            }
            Err(ConfFail::Text(msg)) => {
                self.log(NGX_LOG_EMERG, msg);
                NGX_CONF_ERROR
            }
            Err(ConfFail::Nginx(msg)) => msg.as_ptr().cast_mut(),
            Err(ConfFail::Logged) => NGX_CONF_ERROR,
        }
    }
}

extern "C" fn block_directive<B: Block>(
    cf: *mut ngx_conf_t,
    _dummy: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is the `B::State` that `parse_block` put into cf->handler_conf for the
    // duration of ngx_conf_parse (nothing else refers to it meanwhile); cf is the
    // configuration being parsed.
    let (cf, state) = unsafe { (&*cf, &mut *conf.cast::<B::State>()) };
    cf.result(B::directive(cf, state))
}

/// Parses the `{ ... }` of the block directive being handled, each directive inside going to
/// `B::directive` with `state`, as nginx's own block directives do (on a copy of `cf` whose
/// handler is `B`'s). A failure was logged by nginx or by the handler.
pub fn parse_block<B: Block>(cf: &ngx_conf_t, state: &mut B::State) -> Result<(), ConfFail> {
    let mut block_cf: ngx_conf_t = *cf;
    block_cf.handler = Some(block_directive::<B>);
    block_cf.handler_conf = ptr::from_mut(state).cast::<c_void>();
    // SAFETY: block_cf is a valid configuration (a copy of nginx's, positioned at the block);
    // state outlives the parse that points at it.
    let rv = unsafe { ngx_conf_parse(&mut block_cf, ptr::null_mut()) };
    if rv != NGX_CONF_OK {
        return Err(ConfFail::Logged);
    }
    Ok(())
}

/// A regular expression compiled with nginx's engine (PCRE) in the configuration pool.
#[derive(Clone, Copy, Debug)]
pub struct Regex(NonNull<ngx_regex_t>);

impl Regex {
    /// Compiles `pattern`, case-sensitive, unanchored; the error is PCRE's text.
    pub fn compile(cf: &ngx_conf_t, pattern: &str) -> Result<Regex, String> {
        let mut err = [0u8; NGX_MAX_CONF_ERRSTR as usize];
        // The compiled regex may keep pointing at its pattern: copy it into the pool.
        let pattern = cf
            .copy_str(pattern.as_bytes())
            .ok_or_else(|| "out of memory".to_string())?;
        // SAFETY: rc is a zeroed C struct whose used fields are set before the call; the pool
        // is the live configuration pool; err outlives the call that writes into it.
        unsafe {
            let mut rc: ngx_regex_compile_t = core::mem::zeroed();
            rc.pattern = pattern;
            rc.pool = cf.pool;
            rc.err = ngx_str_t {
                len: err.len(),
                data: err.as_mut_ptr(),
            };
            if ngx_regex_compile(&mut rc) != Status::NGX_OK.0 {
                let len = rc.err.len.min(err.len());
                return Err(String::from_utf8_lossy(&err[..len]).into_owned());
            }
            NonNull::new(rc.regex)
                .map(Regex)
                .ok_or_else(|| "out of memory".to_string())
        }
    }

    /// True when `text` matches. Use only while the configuration is parsed (the regex lives
    /// in its pool).
    pub fn is_match(self, text: &str) -> bool {
        let mut s = super::borrowed(text.as_bytes());
        // SAFETY: the regex is compiled in the configuration pool, alive while it is parsed; s
        // borrows text for the call; no captures are requested.
        let n = unsafe { ngx_regex_exec(self.0.as_ptr(), &mut s, ptr::null_mut(), 0) };
        n >= 0
    }
}

// ---- a balancer directive's handler on scratch configurations (`probe.rs`) ----------------

/// Bytes of scratch module configuration (more than any balancer module's server configuration).
const SCRATCH: usize = 512;

/// What a directive handler left in [`call_directive`]'s scratch configurations.
pub struct Scratch {
    /// The scratch upstream's `peer.init_upstream` after the call (0 for none).
    pub init: usize,
    module: &'static ngx_module_t,
    conf: Vec<u8>,
    fill: u8,
}

/// Where a word of a module's server configuration is: the place of a word its directive
/// handler wrote in a scratch configuration ([`Scratch::written_word`]), so the module's real
/// configurations (of the same type) hold a word there ([`Upstream::srv_conf_word`]). Only
/// [`Scratch::written_word`] makes one.
#[derive(Clone, Copy, Debug)]
pub struct SrvConfWord {
    module: &'static ngx_module_t,
    off: usize,
}

impl Upstream {
    /// The machine word of the upstream's server configuration of `at.module` at `at`'s place
    /// (None when it has none: an implicit upstream).
    pub fn srv_conf_word(self, at: SrvConfWord) -> Option<usize> {
        let conf = self.module_srv_conf(at.module).cast::<u8>();
        // SAFETY: conf is the module's server configuration of this upstream, of the type in
        // which its directive handler wrote the word at `at.off` (see `SrvConfWord`).
        (!conf.is_null()).then(|| unsafe { ptr::read_unaligned(conf.add(at.off).cast()) })
    }
}

impl Scratch {
    /// The scratch module configuration's machine words, in order.
    pub fn words(&self) -> impl Iterator<Item = usize> + '_ {
        self.conf
            .chunks_exact(size_of::<usize>())
            .map(|w| usize::from_ne_bytes(w.try_into().unwrap_or_default()))
    }

    /// The place of word `i` of the scratch configuration, when the handler wrote it (it is no
    /// longer the fill pattern): a field of the module's configuration type.
    pub fn written_word(&self, i: usize) -> Option<SrvConfWord> {
        let w = self.words().nth(i)?;
        (w != usize::from_ne_bytes([self.fill; size_of::<usize>()])).then_some(SrvConfWord {
            module: self.module,
            off: i * size_of::<usize>(),
        })
    }
}

/// Calls `module`'s directive `cmd` with `args` on a scratch upstream whose `init_upstream` is
/// `preset` and whose module configuration is `SCRATCH` bytes of `fill`; None when nginx has
/// no such module or directive, or the handler failed.
pub fn call_directive(
    cf: &ngx_conf_t,
    module: &str,
    cmd: &CStr,
    args: &[&CStr],
    preset: ngx_http_upstream_init_pt,
    fill: u8,
) -> Option<Scratch> {
    let m = super::loaded_module(cf, module)?;
    // SAFETY: the handler sees a copy of cf whose ctx points at scratch configurations that
    // live until it returns; the words it reads are in `words`, and the module conf it writes
    // is `SCRATCH` bytes (larger than any balancer's srv conf). `m.commands` is the module's
    // table, ended by an entry with an empty name.
    unsafe {
        let mut c = m.commands as *const ngx_command_t;
        if c.is_null() {
            return None;
        }
        while (*c).name.len != 0 {
            if bytes(&(*c).name) == cmd.to_bytes() {
                break;
            }
            c = c.add(1);
        }
        let set = (*c).set?;
        let mut scratch_uscf: ngx_http_upstream_srv_conf_t = zeroed();
        scratch_uscf.peer.init_upstream = preset;
        let up_idx = (*ptr::addr_of!(ngx_http_upstream_module)).ctx_index;
        let mut srv: Vec<*mut c_void> = vec![ptr::null_mut(); up_idx + 1];
        srv[up_idx] = ptr::addr_of_mut!(scratch_uscf).cast();
        let mut ctx = ngx_http_conf_ctx_t {
            main_conf: (*(cf.ctx as *mut ngx_http_conf_ctx_t)).main_conf,
            srv_conf: srv.as_mut_ptr(),
            loc_conf: (*(cf.ctx as *mut ngx_http_conf_ctx_t)).loc_conf,
        };
        let mut words: Vec<ngx_str_t> = Vec::with_capacity(args.len() + 1);
        // C strings: handlers may compare with ngx_strcmp, which needs the terminating zero.
        words.push(borrowed(cmd.to_bytes()));
        words.extend(args.iter().map(|a| borrowed(a.to_bytes())));
        let mut arr = ngx_array_t {
            elts: words.as_mut_ptr().cast(),
            nelts: words.len(),
            size: size_of::<ngx_str_t>(),
            nalloc: words.len(),
            pool: cf.pool,
        };
        let mut scratch_cf = *cf;
        scratch_cf.ctx = ptr::addr_of_mut!(ctx).cast();
        scratch_cf.args = ptr::addr_of_mut!(arr);
        let mut conf = vec![fill; SCRATCH];
        let rv: *mut c_char = set(
            ptr::addr_of_mut!(scratch_cf),
            c.cast_mut(),
            conf.as_mut_ptr().cast(),
        );
        if !rv.is_null() {
            return None;
        }
        let init = scratch_uscf.peer.init_upstream.map_or(0, |f| f as usize);
        Some(Scratch {
            init,
            module: m,
            conf,
            fill,
        })
    }
}

// ---- a new upstream block -------------------------------------------------------------

/// The flags nginx gives an explicit `upstream {}` block (plain round robin).
pub const ROUND_ROBIN_FLAGS: u32 = NGX_HTTP_UPSTREAM_CREATE
    | NGX_HTTP_UPSTREAM_WEIGHT
    | NGX_HTTP_UPSTREAM_MAX_CONNS
    | NGX_HTTP_UPSTREAM_MAX_FAILS
    | NGX_HTTP_UPSTREAM_FAIL_TIMEOUT
    | NGX_HTTP_UPSTREAM_DOWN
    | NGX_HTTP_UPSTREAM_BACKUP;

/// Registers a new explicit round-robin upstream `name`, as if `upstream NAME {}` appeared at the
/// current line: nginx's own checks apply (`duplicate upstream "NAME"` is logged by nginx). Every
/// HTTP module gets a fresh server configuration for it, like for an `upstream {}` block.
pub fn create(cf: &mut ngx_conf_t, name: &[u8]) -> Option<Upstream> {
    let host = cf.copy_str(name)?;
    // SAFETY: mirrors what nginx's `upstream` block handler does: ngx_url_t zeroed with the host
    // set, ngx_http_upstream_add with the CREATE flag, then one srv conf per HTTP module (each
    // module's create_srv_conf called with this configuration).
    unsafe {
        let mut url: ngx_url_t = mem::zeroed();
        url.host = host;
        url.set_no_resolve(1);
        url.set_no_port(1);
        let u = ngx_http_upstream_add(cf, &mut url, ROUND_ROBIN_FLAGS as _);
        if u.is_null() {
            return None;
        }
        let max = *ptr::addr_of!(ngx_http_max_module);
        let srv_conf =
            ngx_pcalloc(cf.pool, mem::size_of::<*mut c_void>() * max) as *mut *mut c_void;
        if srv_conf.is_null() {
            return None;
        }
        let cycle = cf.cycle;
        for i in 0..(*cycle).modules_n {
            let m = *(*cycle).modules.add(i);
            if m.is_null() || (*m).type_ != NGX_HTTP_MODULE as usize {
                continue;
            }
            let mctx = (*m).ctx as *const ngx_http_module_t;
            if let Some(create_srv_conf) = (*mctx).create_srv_conf {
                let c = create_srv_conf(cf);
                if c.is_null() {
                    return None;
                }
                *srv_conf.add((*m).ctx_index) = c;
            }
        }
        *srv_conf.add(NgxHttpUpstreamModule::module().ctx_index) = u.cast();
        (*u).srv_conf = srv_conf;
        (*u).servers = ngx_array_create(cf.pool, 4, mem::size_of::<ngx_http_upstream_server_t>());
        if (*u).servers.is_null() {
            return None;
        }
        Upstream::from_ptr(u)
    }
}
