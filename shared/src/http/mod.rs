//! The outbound side: the SSRF guard and the webhook sender.

pub mod sender;
pub mod ssrf;

pub use sender::{
    HttpSender, LocalFault, OutboundRequest, OutboundResponse, SenderConfig, Transport,
};
pub use ssrf::{AddressPolicy, SsrfError};
