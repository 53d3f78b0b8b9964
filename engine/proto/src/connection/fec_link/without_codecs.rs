//! The FEC link of a build without the `fec` feature (no codecs compiled in), and the
//! unwrapping of a peer's `FecData` packet it shares with the tests.

use super::*;

/// Without the `fec` feature (no codecs compiled in): this side sends no FEC whatever its
/// policy, and takes the ARQ datagram out of each of its peer's `FecData` packets as it
/// arrives, with no recovery of lost ones (ARQ retransmits them); the peer's parity packets are
/// counted ([`ReceiverStats::parity_ignored`]) and dropped. Both ends stay interoperable.
#[cfg(not(feature = "fec"))]
#[derive(Debug)]
pub(crate) struct FecLink {
    /// Kept for the endpoint's shared budget (nothing is ever retained from it).
    budget: RetentionBudget,
    /// The ARQ datagram the last `FecData` packet carried, and its length.
    out: Vec<u8>,
    out_lens: Vec<usize>,
    receiver: ReceiverStats,
}

#[cfg(not(feature = "fec"))]
impl FecLink {
    pub(crate) fn new(_cfg: &Config, _tag: usize) -> Self {
        FecLink {
            budget: RetentionBudget::default(),
            out: Vec::new(),
            out_lens: Vec::new(),
            receiver: ReceiverStats::default(),
        }
    }

    pub(crate) fn set_budget_limit(&mut self, limit: usize) {
        self.budget = RetentionBudget::new(limit);
    }

    pub(crate) fn budget_mut(&mut self) -> &mut RetentionBudget {
        &mut self.budget
    }

    pub(crate) fn retained_bytes(&self) -> usize {
        0
    }

    pub(crate) fn receiving(&self) -> bool {
        false
    }

    pub(crate) fn reorder_allowance(&self) -> u64 {
        0
    }

    pub(crate) fn reorder_delay(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    pub(crate) fn arq_budget(&self, udp: usize) -> usize {
        udp.saturating_sub(TAG_LEN)
    }

    pub(crate) fn seal(
        &mut self,
        _now: Instant,
        _dst: ConnectionId,
        _buf: &mut [u8],
        len: usize,
        _remaining: Option<(u32, u32)>,
    ) -> (usize, usize) {
        (len, wire::DATA_HEADER_LEN)
    }

    pub(crate) fn next_parity(&self) -> Option<usize> {
        None
    }

    pub(crate) fn idle_at(&self, _now: Instant) -> bool {
        true
    }

    pub(crate) fn poll_parity(
        &mut self,
        _now: Instant,
        _dst: ConnectionId,
        _buf: &mut [u8],
        _cc: &mut Congestion,
    ) -> Option<usize> {
        None
    }

    pub(crate) fn on_acked(&mut self, _sent: Instant, _delivered: bool, _cc: &mut Congestion) {}

    /// Nothing to hint without the `fec` feature.
    pub(crate) fn prefetch(&self) {}

    pub(crate) fn parity_in_flight(&self) -> bool {
        false
    }

    pub(crate) fn on_rto(&mut self, _cc: &mut Congestion) {}

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    pub(crate) fn handle_timeout(&mut self, _now: Instant) {}

    pub(crate) fn on_loss_report(&mut self, _received: u64, _lost: u64, _max_burst: u64) {}

    pub(crate) fn on_congestion_loss(&mut self, _n: u64) {}

    pub(crate) fn take_loss_report(&mut self) -> Option<(u64, u64, u64)> {
        None
    }

    /// A data body yields its ARQ datagram (from its packet number on); a parity body is
    /// counted and dropped. `Err`: malformed, dropped and counted.
    pub(crate) fn receive(
        &mut self,
        cfg: &Config,
        _now: Instant,
        body: &[u8],
        parity: bool,
    ) -> Result<(), FecError> {
        self.out.clear();
        self.out_lens.clear();
        if parity {
            self.receiver.parity_received += 1;
            self.receiver.parity_ignored += 1;
            return Ok(());
        }
        let r = unwrap_data(cfg, body).map(|payload| {
            self.out.extend_from_slice(payload);
            self.out_lens.push(payload.len());
        });
        self.receiver.malformed.tally(r)?;
        self.receiver.data_delivered += 1;
        Ok(())
    }

    pub(crate) fn take_datagrams(&mut self) -> (Vec<u8>, Vec<usize>) {
        (
            std::mem::take(&mut self.out),
            std::mem::take(&mut self.out_lens),
        )
    }

    pub(crate) fn restore_datagrams(&mut self, out: Vec<u8>, lens: Vec<usize>) {
        self.out = out;
        self.out_lens = lens;
    }

    pub(crate) fn trim(&mut self, _now: Instant) {
        self.out = Vec::new();
        self.out_lens = Vec::new();
    }

    pub(crate) fn stats(&self) -> FecStats {
        FecStats {
            malformed: self.receiver.malformed,
            receiver: self.receiver,
            retention_limit: self.budget.limit(),
            ..FecStats::default()
        }
    }
}

/// The ARQ datagram a `FecData` body carries, from its packet number on (the protected
/// payload), as the FEC receiver delivers it. What a connection without the FEC codecs hands
/// ARQ for each of its peer's data packets.
#[cfg(any(test, not(feature = "fec")))]
pub(super) fn unwrap_data<'a>(cfg: &Config, body: &'a [u8]) -> Result<&'a [u8], FecError> {
    let (_, payload) = crate::fec::header::DataHeader::parse(body)?;
    // No larger than what a peer with the same datagram limit protects.
    let max = crate::fec::max_protected_payload(
        cfg.max_path_datagram_size(),
        FEC_PARITY_HEADER_LEN + TAG_LEN,
    );
    if payload.len() > max {
        return Err(FecError::LengthTooLarge);
    }
    Ok(payload)
}
