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
    pub publish: PublishMode,
}

/// Who creates and queues the deliveries of a published event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishMode {
    /// The publish call writes the event with its deliveries and queues them itself (the
    /// embedded shape, whose dispatcher is in the same process).
    WithDeliveries,
    /// The publish call writes the event alone, as the outbox helper does; the store's change
    /// stream hands it to fan-out, which creates and queues its deliveries (the AWS shape:
    /// one cheap write on the request path, and the queue's messages sent ten at a time).
    ThroughStream,
}
