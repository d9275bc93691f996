//! The safe side of the request's hooks: the traits a feature implements for the trampolines
//! of `mod.rs` (content handlers, request bodies, output filters), why a body could not be read,
//! and what a filter does to the body chain it was passed.

use ngx::ffi::ngx_conf_t;
use ngx::http::{HttpModuleLocationConf, NgxHttpCoreModule};

use super::{content, Chain, Req};
use crate::ffi::{ConfFail, Status};

/// A location's content handler.
pub trait ContentHandler {
    /// Answers `r` (nginx's content handler result: a status, `NGX_DONE`, ...).
    fn handle(r: Req) -> Status;
}

/// Makes `H` the content handler of the location being parsed.
pub fn set_content_handler<H: ContentHandler>(cf: &ngx_conf_t) -> Result<(), ConfFail> {
    let clcf = NgxHttpCoreModule::location_conf_mut(cf).ok_or(ConfFail::Logged)?;
    clcf.handler = Some(content::<H>);
    Ok(())
}

/// What runs once a request body was read ([`Req::read_body`]).
pub trait BodyReader {
    /// Answers `r`; the returned status finalizes the request.
    fn body_read(r: Req) -> Status;
}

/// Why [`Req::body`] gave no body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Longer than the limit.
    TooLarge,
    /// Its temporary file could not be read back.
    Unreadable,
}

/// The module's header and body filters.
pub trait Filters {
    /// A response header is being sent for `r`; pass it on with [`super::next_header`] (or not).
    fn header(r: Req) -> Status;
    /// Body buffers of `r` are being sent; pass them on with [`super::next_body`] (or not).
    fn body(r: Req, chain: Chain) -> Status;
}

impl Chain {
    /// Marks every buffer consumed (`pos = last`, `file_pos = file_last` for file buffers).
    pub fn consume(self) {
        self.each_buf(|b| {
            b.pos = b.last;
            if b.in_file() != 0 {
                b.file_pos = b.file_last;
            }
        });
    }

    /// Promotes `last_in_chain` to `last_buf` (a subrequest's last buffer becomes the end of
    /// the response).
    pub fn promote_last_in_chain(self) {
        self.each_buf(|b| {
            if b.last_in_chain() != 0 {
                b.set_last_buf(1);
            }
        });
    }
}
