//! An endpoint's health at a glance: its attempts of the last 24 hours and 7 days.

use super::*;
use crate::{api::views::EndpointStatsView, service::endpoints};

#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/endpoints/{endpoint}/stats",
    security(("bearer" = ["endpoints:read"])),
    tag = "endpoints",
    summary = "The endpoint's attempts of the last 24 hours and 7 days, hour by hour, and its last failure.",
    description = "Every attempt counts (scheduled, manual and test), by the hour it finished in. On AWS the sender writes a batch's counts when the batch is done, so the current hour can lag by one batch; a sender that crashes loses its batch's counts (the deliveries themselves are unaffected).",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint's counts", body = EndpointStatsView), ReadErrors),
)]
pub async fn endpoint_stats(
    State(state): State<ApiState>,
    ScopedId(account, endpoint): ScopedId<EndpointId>,
) -> ApiResult<Response> {
    let (endpoint, stats) = endpoints::stats(&state.app, &account, &endpoint).await?;
    Ok(Json(EndpointStatsView::new(&endpoint, &stats)).into_response())
}
