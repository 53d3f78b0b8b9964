//! [`ClientSet`]: many clients driven from one thread, at a cost per turn that follows the
//! members with work, not the size of the set.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

use ricochet_platform as platform;

use ricochet_proto::token::ConnectToken;
use ricochet_proto::{PrefetchStage, TimerQueue};

use super::{Client, ClientConfig, ClientError, ClientEvent, ConnectLimit};

/// A member of a [`ClientSet`] failed, or the set's wait did.
#[derive(Debug)]
#[non_exhaustive]
pub struct ClientSetError {
    /// The member's index in the set; `None` when the wait over every member failed.
    pub index: Option<usize>,
    /// What failed.
    pub source: ClientError,
    /// From [`ClientSet::connect`] and [`ClientSet::connect_insecure`]: every other member
    /// that did not connect, by index, with why (empty otherwise). With `index` and `source`,
    /// each member's outcome: the members named nowhere had connected, and were closed when
    /// the call gave up.
    pub other_failures: Vec<(usize, ClientError)>,
}

impl std::fmt::Display for ClientSetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            Some(i) => write!(f, "client {i} of the set: {}", self.source)?,
            None => write!(f, "the client set: {}", self.source)?,
        }
        match self.other_failures.len() {
            0 => Ok(()),
            n => write!(f, " (and {n} more members failed)"),
        }
    }
}

impl std::error::Error for ClientSetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// How long [`ClientSet::connect`] drives the closes of the members it gives up on, at most.
const CLOSE_LIMIT: Duration = Duration::from_secs(2);

/// How long a turn waits at most while a socket has refused part of a submission.
const SEND_RETRY: Duration = Duration::from_millis(1);

fn fail(index: Option<usize>) -> impl Fn(ClientError) -> ClientSetError {
    move |source| ClientSetError {
        index,
        source,
        other_failures: Vec::new(),
    }
}

/// What the set tracks about each member besides the client itself.
#[derive(Debug, Default, Clone, Copy)]
struct Member {
    /// The descriptor registered with the poller, and the backend generation it belongs to.
    registered: Option<(i32, u64)>,
    /// Queued for the next turn's submission (it may have output).
    touched: bool,
    /// Listed in the set's event queue.
    queued_events: bool,
    /// Connected as of the last look (for [`ClientSet::connected`]).
    connected: bool,
    /// Closed as of the last look.
    closed: bool,
}

/// Several [`Client`]s driven from one thread, as a load tester or a bot farm runs hundreds or
/// thousands of connections on a few threads: each member keeps its own socket and
/// connection; the set registers every member's socket once with the kernel's readiness
/// interface (epoll, kqueue) and keeps the members' protocol timers in one heap, so a turn
/// costs in proportion to the members with something to do — the ready, the due and the ones
/// the application touched — not to the size of the set.
///
/// ```no_run
/// use ricochet::client::{ClientConfig, ClientEvent, ClientSet};
/// use ricochet::proto::token::ConnectToken;
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tokens: Vec<ConnectToken> = Vec::new();
/// // One token per bot, from the backend (or minted with the key in a test rig): the bots
/// // connect at once from this thread.
/// let mut set = ClientSet::connect(&tokens, &ClientConfig::new(), Duration::from_secs(10))?;
/// for i in 0..set.len() {
///     set.send(i, 0, &b"hello"[..])?;
/// }
/// loop {
///     set.step(Duration::from_millis(5))?;
///     while let Some((i, event)) = set.poll_event() {
///         if let ClientEvent::Message { data, .. } = event {
///             set.send(i, 0, data)?; // keep it going
///         }
///     }
/// }
/// # }
/// ```
///
/// With io_uring, members must be driven by the thread that created them (connect on the
/// thread that will call [`ClientSet::step`]).
///
/// Each member holds a socket, so a set of N members needs N descriptors beside the rest of
/// the process: many systems start processes at a soft limit of 1,024 (`ulimit -n`; a program
/// may raise its soft limit up to the hard one with `setrlimit(RLIMIT_NOFILE)`, as the `bench`
/// binary does). A member refused a socket by the limit fails with an error that names it.
#[derive(Debug, Default)]
pub struct ClientSet {
    clients: Vec<Client>,
    members: Vec<Member>,
    /// Made with the first member; an error making it or registering a member is kept for the
    /// next [`ClientSet::step`].
    poller: Option<platform::Poller>,
    deferred: Option<ClientSetError>,
    /// The members' protocol deadlines (at most one entry each). A touched member's entry may
    /// be stale or missing: it is brought up to date after the member's submission at the
    /// next turn, not at every arrival.
    timers: TimerQueue,
    /// Members to submit for at the next turn.
    touched: Vec<u32>,
    /// Scratch: the timer entries due in one turn.
    due: Vec<(Instant, u32)>,
    /// Members with events waiting, in arrival order.
    with_events: VecDeque<u32>,
    /// Scratch: ready tokens of one wait.
    ready: Vec<u64>,
    connected: usize,
    /// The first member that closed before connecting, if any.
    first_failed: Option<usize>,
}

impl ClientSet {
    /// An empty set.
    pub fn new() -> Self {
        ClientSet::default()
    }

    /// Connect one client per token at once (each with its own socket) and wait until every
    /// handshake completed, up to `timeout`. The clients start their handshakes one after
    /// another without waiting for each other, so a thousand connect in about the time one
    /// does. The call waits for each member's outcome; if any member is refused, its
    /// handshake times out or `timeout` passes first, the call fails, reporting every member
    /// that did not connect (the first as [`ClientSetError::index`] and
    /// [`ClientSetError::source`], the others in [`ClientSetError::other_failures`]), and
    /// first closes the members that did connect or still were connecting, so no server
    /// holds them until its idle timeout (closing takes up to two more seconds). Members have `config`, with the seed (if set) advanced by
    /// their index; [`BackendKind::Auto`](platform::BackendKind::Auto) picks the readiness
    /// backend (epoll with `recvmmsg`/`sendmmsg`, kqueue on macOS), since the set waits on the
    /// members' sockets itself, where a lone [`Client`] on `auto` may pick io_uring
    /// ([`Client::selection_reason`] of a member says so; see [`ClientConfig::backend`]). The `Connected` events are not queued: returning `Ok` says it.
    pub fn connect(
        tokens: &[ConnectToken],
        config: &ClientConfig,
        timeout: Duration,
    ) -> Result<ClientSet, ClientSetError> {
        let mut set = ClientSet::new();
        set.start_connecting(tokens, config)?;
        set.finish_connect(timeout)?;
        Ok(set)
    }

    /// [`ClientSet::connect`] for `n` clients of a server in insecure mode (no tokens, no
    /// packet protection: LAN play, local tests, load tests of the insecure path).
    pub fn connect_insecure(
        server: SocketAddr,
        config: &ClientConfig,
        n: usize,
        timeout: Duration,
    ) -> Result<ClientSet, ClientSetError> {
        let mut set = ClientSet::new();
        set.start_connecting_insecure(server, config, n)?;
        set.finish_connect(timeout)?;
        Ok(set)
    }

    /// Waits until each member connected or failed, up to `timeout`. If any did not connect,
    /// closes the others (a server would otherwise hold their sessions until its idle
    /// timeout) and reports every member that failed.
    fn finish_connect(&mut self, timeout: Duration) -> Result<(), ClientSetError> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let failed = self.members.iter().filter(|m| m.closed).count();
            if self.connected + failed == self.clients.len() {
                break;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let left = deadline.map_or(Duration::MAX, |d| d - now);
            if let Err(e) = self.turn(left.min(Duration::from_millis(50)), true) {
                self.close_all();
                return Err(e);
            }
        }
        let mut failures: Vec<(usize, ClientError)> = (0..self.clients.len())
            .filter(|&i| !self.clients[i].connected)
            .map(|i| {
                let why = if self.members[i].closed {
                    self.failure(i)
                } else {
                    ClientError::TimedOut {
                        limit: timeout,
                        which: ConnectLimit::Caller,
                    }
                };
                (i, why)
            })
            .collect();
        if !failures.is_empty() {
            self.close_all();
            let (index, source) = failures.remove(0);
            return Err(ClientSetError {
                index: Some(index),
                source,
                other_failures: failures,
            });
        }
        for c in &mut self.clients {
            c.events.retain(|e| *e != ClientEvent::Connected);
        }
        let (clients, members) = (&self.clients, &mut self.members);
        self.with_events.retain(|&i| {
            let keep = !clients[i as usize].events.is_empty();
            members[i as usize].queued_events = keep;
            keep
        });
        Ok(())
    }

    /// Closes every member still open (connected or connecting) and drives the set until the
    /// closes are done: each server answers its close, or the close gives up after three RTOs.
    fn close_all(&mut self) {
        for i in 0..self.clients.len() {
            if self.clients[i].closed.is_none() {
                self.clients[i].close();
                self.touch(i);
            }
        }
        // Bounded whatever the closes do: a close ends by itself after three RTOs (RTOs back
        // off from the handshake's, a few hundred milliseconds at most here).
        let deadline = Instant::now() + CLOSE_LIMIT;
        while self.clients.iter().any(|c| c.closed.is_none()) && Instant::now() < deadline {
            if self.turn(Duration::from_millis(20), true).is_err() {
                // A socket error: what could be sent was sent.
                break;
            }
        }
    }

    /// Add one member per token, each connecting (see [`ClientSet::connect`] for their
    /// configuration): their first datagrams leave together with the set's next turn
    /// ([`ClientSet::step`], [`ClientSet::wait_connected`] or [`ClientSet::update`]). Their
    /// outcome comes as events, or wait for it with [`ClientSet::wait_connected`]. Returns
    /// their indices.
    pub fn start_connecting(
        &mut self,
        tokens: &[ConnectToken],
        config: &ClientConfig,
    ) -> Result<Range<usize>, ClientSetError> {
        self.start_each(config, tokens.len(), |k, cfg| Client::open(&tokens[k], cfg))
    }

    /// [`ClientSet::start_connecting`] for `n` clients of a server in insecure mode.
    pub fn start_connecting_insecure(
        &mut self,
        server: SocketAddr,
        config: &ClientConfig,
        n: usize,
    ) -> Result<Range<usize>, ClientSetError> {
        self.start_each(config, n, |_, cfg| Client::open_insecure(server, cfg))
    }

    fn start_each(
        &mut self,
        config: &ClientConfig,
        n: usize,
        connect: impl Fn(usize, ClientConfig) -> Result<Client, ClientError>,
    ) -> Result<Range<usize>, ClientSetError> {
        let first = self.clients.len();
        let mut config = config.clone();
        // An io_uring ring per member would cost a ring's memory each for nothing: the set
        // waits on the members' sockets itself.
        #[cfg(target_os = "linux")]
        if config.backend.kind == platform::BackendKind::Auto {
            config.backend.kind = platform::BackendKind::Mmsg;
            config.auto_in_set = true;
        }
        let seed = config.seed;
        // Room for them at once: growing by doubling would move every member made so far
        // (a client is a large struct) several times over.
        self.clients.reserve(n);
        self.members.reserve(n);
        for k in 0..n {
            config.seed = seed.map(|s| s.wrapping_add(k as u64));
            let c = connect(k, config.clone()).map_err(fail(Some(first + k)))?;
            self.push(c);
        }
        Ok(first..first + n)
    }

    /// Drive the set until every member is connected, up to `timeout`. Fails with the index of
    /// the first member that closed instead (refused, or its handshake timed out), or with
    /// [`ClientError::TimedOut`] (the caller's limit) when `timeout` passes first. Events stay
    /// queued.
    pub fn wait_connected(&mut self, timeout: Duration) -> Result<(), ClientSetError> {
        // A limit past the clock's range (`Duration::MAX` for "no limit") sets no deadline.
        let deadline = Instant::now().checked_add(timeout);
        // A failed member replaced since the last turn is not that failure any more.
        for k in 0..self.touched.len() {
            let i = self.touched[k] as usize;
            if self.backend_changed(i) {
                self.forget_replaced(i);
            }
        }
        loop {
            if let Some(i) = self.first_failed {
                let source = self.failure(i);
                return Err(fail(Some(i))(source));
            }
            if self.connected == self.clients.len() {
                return Ok(());
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(fail(None)(ClientError::TimedOut {
                    limit: timeout,
                    which: ConnectLimit::Caller,
                }));
            }
            // Handshake replies call for no acknowledgement: `update` sends what they did.
            let left = deadline.map_or(Duration::MAX, |d| d - now);
            self.turn(left.min(Duration::from_millis(50)), true)?;
        }
    }

    /// Why member `i`, closed before it connected, did not connect.
    fn failure(&self, i: usize) -> ClientError {
        let c = &self.clients[i];
        match c.closed {
            Some((ricochet_proto::CloseReason::HandshakeTimeout, _)) => ClientError::TimedOut {
                limit: c.config.endpoint.connection.handshake_timeout,
                which: ConnectLimit::Handshake,
            },
            Some((ricochet_proto::CloseReason::VersionMismatch, _)) => ClientError::VersionMismatch,
            Some((ricochet_proto::CloseReason::Rejected(code), _)) => ClientError::Rejected {
                code,
                message: c.refusal_message(),
            },
            Some((reason, _)) => ClientError::Refused(reason),
            None => ClientError::Refused(ricochet_proto::CloseReason::Application),
        }
    }

    /// Add a client; returns its index (members keep their index until the set is dropped).
    pub fn push(&mut self, client: Client) -> usize {
        let i = self.clients.len();
        self.clients.push(client);
        self.members.push(Member::default());
        self.touch(i);
        self.sync(i);
        i
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// True when the set has no member.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Members connected now (as of the last turn that saw them).
    pub fn connected(&self) -> usize {
        self.connected
    }

    /// Member `index`.
    pub fn get(&self, index: usize) -> Option<&Client> {
        self.clients.get(index)
    }

    /// Member `index`, to read or change. Only an accessor: the set does not look at what
    /// changed through it. A message queued or a close made through it leaves when the set
    /// next serves the member for another reason (an arrival, a timer); to have it go with
    /// the next turn, use [`ClientSet::send`] and [`ClientSet::close`], or call
    /// [`ClientSet::mark_changed`] after the change (needed too after a rebind or after
    /// replacing the member in place, so the set registers its new socket).
    pub fn get_mut(&mut self, index: usize) -> Option<&mut Client> {
        self.clients.get_mut(index)
    }

    /// Every member, by index: an accessor like [`ClientSet::get_mut`] (call
    /// [`ClientSet::mark_changed`] for the members changed through it).
    pub fn clients_mut(&mut self) -> &mut [Client] {
        &mut self.clients
    }

    /// Queue a message on member `index`'s `channel`; it leaves with the set's next turn
    /// ([`Client::send`] through the set).
    pub fn send(
        &mut self,
        index: usize,
        channel: u8,
        data: impl Into<bytes::Bytes>,
    ) -> Result<(), ClientSetError> {
        let c = self.clients.get_mut(index).ok_or_else(|| {
            fail(Some(index))(ClientError::Send(
                ricochet_proto::SendError::UnknownConnection,
            ))
        })?;
        c.send(channel, data).map_err(fail(Some(index)))?;
        self.touch(index);
        Ok(())
    }

    /// Close member `index` gracefully ([`Client::close`] through the set); the close leaves
    /// with the set's next turn. Nothing happens for an index past the set.
    pub fn close(&mut self, index: usize) {
        if let Some(c) = self.clients.get_mut(index) {
            c.close();
            self.touch(index);
        }
    }

    /// Have the set serve member `index` at its next turn: submit what it queued, look at its
    /// state afresh and register its socket if it changed. Call it after changing a member
    /// through [`ClientSet::get_mut`] or [`ClientSet::clients_mut`]. Nothing happens for an
    /// index past the set.
    pub fn mark_changed(&mut self, index: usize) {
        if index < self.clients.len() {
            self.touch(index);
        }
    }

    /// The members, by index.
    pub fn into_clients(self) -> Vec<Client> {
        self.clients
    }

    /// The next event of any member, with the member's index. Members with events take turns,
    /// one event each. Events stay queued until taken here, so a set whose events are never
    /// taken keeps every message its members receive: take them after each turn.
    pub fn poll_event(&mut self) -> Option<(usize, ClientEvent)> {
        while let Some(i) = self.with_events.pop_front() {
            let i = i as usize;
            self.members[i].queued_events = false;
            if let Some(e) = self.clients[i].poll_event() {
                self.sync_events(i);
                return Some((i, e));
            }
        }
        None
    }

    /// One turn, like [`Client::step`] for every member at once: submit what the members
    /// touched since the last turn queued (with the acknowledgements the last turn's arrivals
    /// called for), wait up to `timeout` until any member's socket is readable or its
    /// protocol timer is due — only a look when a member already has news — then handle what
    /// arrived at the ready members and run the due timers. Events stay queued for
    /// [`ClientSet::poll_event`]. Call it again promptly (a loop), or call
    /// [`ClientSet::update`] when the next turn may be late, so acknowledgements are not held.
    ///
    /// System calls per turn: one send per member with output, one wait for the whole set,
    /// and one receive per member that became ready.
    ///
    /// A member's socket error does not stop the turn: the other members are served and the
    /// timers run, then the first such error is returned (its `index` names the member, which
    /// stays in the set and is tried again next turn).
    pub fn step(&mut self, timeout: Duration) -> Result<(), ClientSetError> {
        self.turn(timeout, false)
    }

    /// [`Self::step`]; with `ignore_events`, queued events do not cut the wait short (a caller
    /// that leaves them for the application, such as [`Self::wait_connected`], would
    /// otherwise spin on them).
    fn turn(&mut self, timeout: Duration, ignore_events: bool) -> Result<(), ClientSetError> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let start = Instant::now();
        // Submit what the touched members queued; the same call reaps what they received.
        let touched = std::mem::take(&mut self.touched);
        let (mut urgent, mut retry) = (false, false);
        for (k, &i) in touched.iter().enumerate() {
            self.prefetch_ahead(&touched, k);
            if let Err(e) = self.submit(i as usize, start, &mut urgent, &mut retry) {
                // Reported once the turn is done; the failed member stays queued for the next
                // turn, and the others go on (one member's broken socket must not stop the
                // set's other sessions and timers).
                self.members[i as usize].touched = false;
                self.touch(i as usize);
                self.deferred.get_or_insert(e);
            }
        }
        self.touched_scratch(touched);
        // One wait for the whole set; only a look when some member has news already, and short
        // when a socket refused part of a submission (the poller waits for readability only).
        let wait = if urgent || (!ignore_events && !self.with_events.is_empty()) {
            Duration::ZERO
        } else {
            let now = Instant::now();
            let wait = match self.next_timer() {
                Some(t) => t.saturating_duration_since(now).min(timeout),
                None => timeout,
            };
            if retry {
                wait.min(SEND_RETRY)
            } else {
                wait
            }
        };
        self.ready.clear();
        if let Some(p) = self.poller.as_mut() {
            p.wait(Some(wait), &mut self.ready)
                .map_err(|e| fail(None)(e.into()))?;
        } else if !wait.is_zero() {
            // No member yet: nothing to wait on but the clock.
            std::thread::sleep(wait);
        }
        let now = Instant::now();
        let ready = std::mem::take(&mut self.ready);
        for (k, &token) in ready.iter().enumerate() {
            let i = token as usize;
            self.prefetch_ahead(&ready, k);
            let Some(c) = self.clients.get_mut(i) else {
                continue;
            };
            if let Err(e) = c.backend.poll(&mut c.send_batch, Some(Duration::ZERO)) {
                // As in the submit pass: reported after the turn, the others go on.
                self.deferred.get_or_insert(fail(Some(i))(e.into()));
                continue;
            }
            c.absorb(now);
            self.touch(i);
            self.sync(i);
        }
        self.ready = ready;
        self.run_due(now);
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        Ok(())
    }

    /// Do every member's pending work without blocking, and send what arrivals call for
    /// ([`Client::update`] for each member; a turn over the whole set).
    pub fn update(&mut self) -> Result<(), ClientSetError> {
        for i in 0..self.clients.len() {
            self.clients[i].update().map_err(fail(Some(i)))?;
            self.members[i].touched = false;
            self.sync(i);
        }
        self.touched.clear();
        Ok(())
    }

    /// Submits what member `i` queued. `urgent` is set when its backend reaped arrivals that
    /// call for a reply (sent at the next turn), `retry` when its socket took only part.
    fn submit(
        &mut self,
        i: usize,
        start: Instant,
        urgent: &mut bool,
        retry: &mut bool,
    ) -> Result<(), ClientSetError> {
        self.members[i].touched = false;
        let c = &mut self.clients[i];
        c.transmit(start);
        if c.backend.needs_poll() {
            c.backend
                .poll(&mut c.send_batch, Some(Duration::ZERO))
                .map_err(|e| fail(Some(i))(e.into()))?;
            c.absorb(Instant::now());
            // What the arrivals call for leaves with the next turn's submission.
            self.touch(i);
            *urgent = true;
        } else if !c.send_batch.is_empty() {
            // Send only: whatever arrived keeps the socket readable, so the wait below
            // reports the member and its receive happens once, in the ready pass.
            c.backend
                .flush(&mut c.send_batch)
                .map_err(|e| fail(Some(i))(e.into()))?;
            if !c.send_batch.is_empty() {
                // The socket took only part: the rest goes with the next turn.
                self.touch(i);
                *retry = true;
            }
        }
        self.sync(i);
        Ok(())
    }

    /// Before member `order[k]`'s turn: hints what its turn reads behind its connection, its
    /// successor's connection, and the struct of the member after that. Each stage reads
    /// what the one before hinted a member earlier, whose loads landed meanwhile (during a
    /// member's work and system calls); see [`PrefetchStage`] and `Endpoint::prefetch`.
    fn prefetch_ahead<T: Copy + TryInto<usize>>(&self, order: &[T], k: usize) {
        let member = |ahead: usize| {
            let j = order.get(k + ahead).and_then(|&j| j.try_into().ok())?;
            self.clients.get(j)
        };
        if let Some(c) = member(0) {
            c.endpoint.prefetch(PrefetchStage::Parts);
        }
        if let Some(c) = member(1) {
            c.endpoint.prefetch(PrefetchStage::Connection);
        }
        if let Some(c) = member(2) {
            platform::prefetch(c);
        }
    }

    /// Runs the protocol timers due at `now`.
    fn run_due(&mut self, now: Instant) {
        // Take the due entries first: a member whose next deadline is "transmit now" must wait
        // for the next turn's submission, not run again here.
        let mut due = std::mem::take(&mut self.due);
        while let Some(entry) = self.timers.pop_due(now) {
            due.push(entry);
        }
        for &(_, i) in &due {
            let i = i as usize;
            self.clients[i].run_timers(now);
            self.touch(i);
            self.sync(i);
        }
        due.clear();
        self.due = due;
        self.timers.shrink();
    }

    /// The earliest member deadline.
    fn next_timer(&self) -> Option<Instant> {
        self.timers.peek()
    }

    fn touched_scratch(&mut self, mut v: Vec<u32>) {
        // Keep the larger buffer; new touches may have landed in `self.touched` meanwhile.
        if v.capacity() > self.touched.capacity() {
            v.clear();
            v.append(&mut self.touched);
            self.touched = v;
        }
    }

    fn touch(&mut self, i: usize) {
        let m = &mut self.members[i];
        if !m.touched {
            m.touched = true;
            self.touched.push(i as u32);
        }
    }

    fn sync_events(&mut self, i: usize) {
        let m = &mut self.members[i];
        if !m.queued_events && !self.clients[i].events.is_empty() {
            m.queued_events = true;
            self.with_events.push_back(i as u32);
        }
    }

    /// Whether member `i`'s client has a backend the set has not registered: it rebound, or
    /// another client took its place (through [`ClientSet::get_mut`], then
    /// [`ClientSet::mark_changed`]; generations are unique in the process).
    fn backend_changed(&self, i: usize) -> bool {
        self.members[i].registered.map(|(_, generation)| generation)
            != Some(self.clients[i].backend_generation)
    }

    /// Member `i`'s backend changed: what the set saw of it goes, and the next sync looks at
    /// the client afresh (a client that took the member's place has its own state; one that
    /// rebound shows the same again).
    fn forget_replaced(&mut self, i: usize) {
        let m = &mut self.members[i];
        if m.connected {
            self.connected -= 1;
        }
        m.connected = false;
        m.closed = false;
        if self.first_failed == Some(i) {
            // The failure to report is now the next member's, if any (a walk over the set,
            // only when the failed member itself is replaced).
            self.first_failed = self
                .members
                .iter()
                .zip(&self.clients)
                .position(|(m, c)| m.closed && !c.ever_connected);
        }
    }

    /// After anything touched member `i`: queue its events, enter its next timer, count its
    /// connection state, and (re-)register its socket if its backend changed.
    fn sync(&mut self, i: usize) {
        self.sync_events(i);
        if self.backend_changed(i) {
            self.forget_replaced(i);
        }
        let c = &self.clients[i];
        let m = &mut self.members[i];
        if !m.touched {
            // A touched member submits at the next turn; its deadline is entered after that.
            let t = c.endpoint.poll_timeout();
            if t != self.timers.deadline(i as u32) {
                self.timers.set(i as u32, t);
            }
        }
        if c.connected != m.connected {
            m.connected = c.connected;
            if c.connected {
                self.connected += 1;
            } else {
                self.connected -= 1;
            }
        }
        if c.closed.is_some() && !m.closed {
            m.closed = true;
            if !c.ever_connected && self.first_failed.is_none() {
                self.first_failed = Some(i);
            }
        }
        let want = (c.backend.ready_fd(), c.backend_generation);
        if m.registered != Some(want) {
            let old = m.registered.replace(want);
            if self.poller.is_none() {
                match platform::Poller::new() {
                    Ok(p) => self.poller = Some(p),
                    Err(e) => {
                        self.deferred.get_or_insert(fail(None)(e.into()));
                        m.registered = None;
                        return;
                    }
                }
            }
            let Some(p) = self.poller.as_mut() else {
                return;
            };
            match old {
                // The same backend now waits on another descriptor (its wake-up set): take
                // the old one, still open, out of the set.
                Some((fd, generation)) if generation == want.1 => {
                    let _ = p.remove(fd);
                }
                // A replaced backend closed its descriptor, which left the set by itself. Its
                // number may already be another member's new socket: removing it by number
                // would take that member's registration.
                _ => {}
            }
            if let Err(e) = p.add(want.0, i as u64) {
                m.registered = None;
                self.deferred.get_or_insert(fail(Some(i))(e.into()));
            }
        }
    }
}
