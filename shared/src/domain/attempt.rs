use serde::Serialize;

use super::ids::DeliveryId;
use crate::clock::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Scheduled,
    Manual,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Manual => "manual",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "scheduled" => Some(Self::Scheduled),
            "manual" => Some(Self::Manual),
            _ => None,
        }
    }
}

/// One HTTP try of a delivery, as the delivery log shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    pub delivery_id: DeliveryId,
    pub number: u32,
    pub trigger: Trigger,
    pub started_at: Timestamp,
    pub latency_ms: u64,
    pub status_code: Option<u16>,
    pub response_headers: Vec<(String, String)>,
    /// The response body, cut at the configured cap and decoded lossily as UTF-8.
    pub response_body: String,
    pub response_body_truncated: bool,
    pub error: Option<String>,
}
