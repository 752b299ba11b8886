use std::sync::Arc;

use crate::{
    clock::Clock, config::CoreConfig, http::Transport, notify::Notifier, queue::Queue, store::Store,
};

/// The engine's ports and rules, wired once at start and shared by every use-case.
#[derive(Clone)]
pub struct App {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub transport: Arc<dyn Transport>,
    pub notifier: Arc<dyn Notifier>,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<CoreConfig>,
}
