//! Placeholder for the Durable Streams subscription APIs (`__ds`), replaced by the real module.

use std::rc::Rc;
use std::sync::Arc;

use crate::http1::{Request, Response};

pub struct Subscriptions {}

impl Default for Subscriptions {
    fn default() -> Self {
        Self::new()
    }
}

impl Subscriptions {
    pub fn new() -> Subscriptions {
        Subscriptions {}
    }

    pub async fn handle(
        self: &Arc<Self>,
        _core: &Rc<pico_engine::CoreHandle>,
        _base_url: &str,
        _root: &str,
        _rest: &str,
        _request: &Request,
    ) -> Response {
        Response::new(404)
    }

    pub fn on_stream_write(
        self: &Arc<Self>,
        _core: &Rc<pico_engine::CoreHandle>,
        _full_path: &str,
        _tail_offset: &str,
    ) {
    }
}
