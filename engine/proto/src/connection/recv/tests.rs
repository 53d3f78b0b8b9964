//! The receiver's reassembly, ordering and budget tests.

use super::*;
use crate::Config;

fn rx(limit: usize) -> Receiver {
    let cfg = Config {
        reassembly_limit: limit,
        ..Config::default()
    };
    Receiver::new(&cfg, Budget::unlimited())
}

#[test]
fn ordered_reassembly_waits_for_the_gap_and_releases_memory() {
    let mut r = rx(1 << 20);
    let (mut ev, mut n) = (VecDeque::new(), 0);
    let t = ricochet_testkit::SimClock::new().now();
    // Message 1 (two fragments) before message 0.
    r.on_fragment(t, 0, 1, 1, 2, b"d", &mut ev, &mut n).unwrap();
    r.on_fragment(t, 0, 1, 0, 2, b"c", &mut ev, &mut n).unwrap();
    assert!(ev.is_empty());
    // One held message (of two fragments): the window counts messages.
    assert_eq!(r.segments, 1);
    r.on_fragment(t, 0, 0, 0, 1, b"ab", &mut ev, &mut n)
        .unwrap();
    let got: Vec<_> = ev.drain(..).collect();
    assert_eq!(
        got,
        vec![
            Event::Message {
                channel: 0,
                data: Bytes::from_static(b"ab")
            },
            Event::Message {
                channel: 0,
                data: Bytes::from_static(b"cd")
            },
        ]
    );
    assert_eq!((r.bytes, r.segments), (0, 0));
    // Duplicates of delivered messages are ignored.
    r.on_fragment(t, 0, 0, 0, 1, b"ab", &mut ev, &mut n)
        .unwrap();
    assert!(ev.is_empty());
    // Inconsistent fragment count is a violation.
    r.on_fragment(t, 0, 5, 0, 3, b"x", &mut ev, &mut n).unwrap();
    assert_eq!(
        r.on_fragment(t, 0, 5, 1, 4, b"y", &mut ev, &mut n),
        Err(DropCause::ProtocolViolation)
    );
}

#[test]
fn unreliable_partials_expire_and_sequenced_drops_stale() {
    let mut r = rx(1 << 20);
    let (mut ev, mut n) = (VecDeque::new(), 0);
    let t = ricochet_testkit::SimClock::new().now();
    r.on_fragment(t, 2, 0, 0, 2, b"half", &mut ev, &mut n)
        .unwrap();
    assert!(r.bytes > 0);
    let d = Duration::from_millis(500);
    assert_eq!(r.next_expiry(d), Some(t + d));
    r.expire(t + d, d);
    assert_eq!(r.bytes, 0);
    assert_eq!(r.unreliable_dropped, 1);
    // Sequenced: 3 delivered, then 2 is stale; a partial 1 is dropped when 3 completes.
    r.on_fragment(t, 3, 1, 0, 2, b"p", &mut ev, &mut n).unwrap();
    r.on_fragment(t, 3, 3, 0, 1, b"new", &mut ev, &mut n)
        .unwrap();
    r.on_fragment(t, 3, 2, 0, 1, b"old", &mut ev, &mut n)
        .unwrap();
    let got: Vec<_> = ev.drain(..).collect();
    assert_eq!(
        got,
        vec![Event::Message {
            channel: 3,
            data: Bytes::from_static(b"new")
        }]
    );
    assert_eq!(r.bytes, 0);
}

/// Sessions that fill the endpoint's shared budget leave every other one its own
/// `OWN_REASSEMBLY` bytes (before, one session's held fragments could take it all).
#[test]
fn a_full_shared_budget_leaves_each_session_its_own_bytes() {
    let cfg = Config::default();
    let t = ricochet_testkit::SimClock::new().now();
    let (mut ev, mut n) = (VecDeque::new(), 0);
    let shared_limit = 64 << 10;
    let mut hog = Receiver::new(&cfg, Budget::new(shared_limit));
    // Reliable messages 1.. held behind the missing message 0, 1 KiB each.
    let mut id = 1;
    while hog
        .on_fragment(t, 0, id, 0, 1, &[0u8; 1024], &mut ev, &mut n)
        .is_ok()
    {
        id += 1;
    }
    assert!(hog.budget.used > shared_limit - 2048, "{}", hog.budget.used);
    assert_eq!(hog.bytes, OWN_REASSEMBLY + hog.budget.used);
    // Another session, handed the shared budget as the endpoint does.
    let mut other = Receiver::new(&cfg, Budget::unlimited());
    std::mem::swap(&mut other.budget, &mut hog.budget);
    for id in 1..=8 {
        other
            .on_fragment(t, 0, id, 0, 1, &[0u8; 1024], &mut ev, &mut n)
            .expect("room of its own");
    }
    assert_eq!(
        other.on_fragment(t, 0, 40, 0, 1, &[0u8; OWN_REASSEMBLY], &mut ev, &mut n),
        Err(DropCause::FlowControl),
        "beyond its own bytes, the shared budget decides"
    );
    // Delivering releases what was held; the refused message keeps only its entry.
    other
        .on_fragment(t, 0, 0, 0, 1, b"m", &mut ev, &mut n)
        .unwrap();
    assert_eq!(other.bytes, SLOT_COST);
}

/// The held ids of channel `ci`, oldest arrival first; checks the arrival list matches the
/// pending map.
fn held(r: &Receiver, ci: usize) -> Vec<u64> {
    let ch = &r.channels[ci];
    let ids: Vec<u64> = ch
        .state
        .arrivals()
        .map_or(Vec::new(), |a| a.iter().map(|&(_, id)| id).collect());
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ch.pending.keys().copied().collect::<Vec<_>>());
    ids
}

/// A peer sending first fragments with descending ids (each a fresh partial message) on
/// the unreliable channels holds at most `MAX_UNRELIABLE_PARTIALS` per channel, whatever
/// its byte budget: expiry and the next-expiry query stay proportional to what expires.
#[test]
fn unreliable_partials_are_capped_per_channel_and_expire_from_the_front() {
    let mut r = rx(64 << 20);
    let (mut ev, mut n) = (VecDeque::new(), 0);
    let t = ricochet_testkit::SimClock::new().now();
    let d = Duration::from_millis(500);
    const SENT: u64 = 10_000;
    for ci in [2u8, 3] {
        for k in 0..SENT {
            let at = t + Duration::from_micros(k);
            r.on_fragment(at, ci, SENT - k, 0, 2, b"x", &mut ev, &mut n)
                .unwrap();
            assert!(r.channels[usize::from(ci)].pending.len() <= MAX_UNRELIABLE_PARTIALS);
        }
        // The newest arrivals stayed (the lowest ids), the older ones were dropped.
        let expect: Vec<u64> = (1..=MAX_UNRELIABLE_PARTIALS as u64).rev().collect();
        assert_eq!(held(&r, usize::from(ci)), expect);
    }
    assert!(ev.is_empty());
    let per = SLOT_COST * 2 + 1;
    assert_eq!(r.bytes, 2 * MAX_UNRELIABLE_PARTIALS * per);
    assert_eq!(
        r.unreliable_dropped,
        2 * (SENT - MAX_UNRELIABLE_PARTIALS as u64)
    );
    // The next expiry is the oldest held message's (both channels saw it at once).
    let oldest = t + Duration::from_micros(SENT - MAX_UNRELIABLE_PARTIALS as u64);
    assert_eq!(r.next_expiry(d), Some(oldest + d));
    // Expiring then drops exactly that one per channel.
    r.expire(oldest + d, d);
    for ci in [2, 3] {
        assert_eq!(held(&r, ci).len(), MAX_UNRELIABLE_PARTIALS - 1);
        assert_eq!(held(&r, ci)[0], MAX_UNRELIABLE_PARTIALS as u64 - 1);
    }
    assert_eq!(
        r.next_expiry(d),
        Some(oldest + Duration::from_micros(1) + d)
    );
    r.expire(t + Duration::from_secs(10), d);
    assert_eq!((held(&r, 2).len(), held(&r, 3).len()), (0, 0));
    assert_eq!((r.bytes, r.next_expiry(d)), (0, None));
    assert_eq!(r.unreliable_dropped, 2 * SENT);
}

/// When an unreliable channel is full, the message seen first gives way (not the lowest
/// id), and one that completes or goes stale leaves the arrival list too.
#[test]
fn a_full_unreliable_channel_drops_its_oldest_partial() {
    let mut r = rx(1 << 20);
    let (mut ev, mut n) = (VecDeque::new(), 0);
    let t = ricochet_testkit::SimClock::new().now();
    let d = Duration::from_millis(500);
    // Arrival order 500, 1, 2, ...: the highest id is the oldest.
    r.on_fragment(t, 2, 500, 0, 2, b"a", &mut ev, &mut n)
        .unwrap();
    for id in 1..MAX_UNRELIABLE_PARTIALS as u64 {
        let at = t + Duration::from_millis(id);
        r.on_fragment(at, 2, id, 0, 2, b"b", &mut ev, &mut n)
            .unwrap();
    }
    assert_eq!(held(&r, 2).len(), MAX_UNRELIABLE_PARTIALS);
    // Message 1 completes: delivered, and out of the list.
    r.on_fragment(t, 2, 1, 1, 2, b"c", &mut ev, &mut n).unwrap();
    assert_eq!(
        ev.drain(..).collect::<Vec<_>>(),
        vec![Event::Message {
            channel: 2,
            data: Bytes::from_static(b"bc")
        }]
    );
    assert!(!held(&r, 2).contains(&1));
    // Two newcomers: the first takes the free place, the second evicts 500.
    let later = t + Duration::from_secs(1);
    r.on_fragment(later, 2, 1000, 0, 2, b"d", &mut ev, &mut n)
        .unwrap();
    assert!(held(&r, 2).contains(&500));
    assert_eq!(r.unreliable_dropped, 0);
    r.on_fragment(later, 2, 1001, 0, 2, b"e", &mut ev, &mut n)
        .unwrap();
    let ids = held(&r, 2);
    assert_eq!(ids.len(), MAX_UNRELIABLE_PARTIALS);
    assert!(!ids.contains(&500) && ids.contains(&2) && ids.ends_with(&[1000, 1001]));
    assert_eq!(r.unreliable_dropped, 1);
    // A clock that steps back keeps the list sorted: the newcomer expires with the newest.
    r.on_fragment(t, 2, 3000, 0, 2, b"f", &mut ev, &mut n)
        .unwrap();
    assert_eq!(held(&r, 2).last(), Some(&3000));
    // Sequenced: a partial below the delivered id goes stale and leaves the list.
    r.on_fragment(t, 3, 4, 0, 2, b"g", &mut ev, &mut n).unwrap();
    r.on_fragment(t, 3, 9, 0, 1, b"h", &mut ev, &mut n).unwrap();
    assert!(held(&r, 3).is_empty());
    r.expire(later + d, d);
    assert!(held(&r, 2).is_empty());
    assert_eq!(r.bytes, 0);
}

/// A fragment of a message cut in several is never empty (the sender cuts
/// `ceil(len / payload)` fragments); an empty whole message is fine.
#[test]
fn an_empty_fragment_of_a_cut_message_is_a_violation() {
    let mut r = rx(1 << 20);
    let (mut ev, mut n) = (VecDeque::new(), 0);
    let t = ricochet_testkit::SimClock::new().now();
    for ci in 0..4 {
        assert_eq!(
            r.on_fragment(t, ci, 0, 0, 2, b"", &mut ev, &mut n),
            Err(DropCause::ProtocolViolation)
        );
        assert_eq!(r.validate(ci, 2, 0), Err(DropCause::ProtocolViolation));
    }
    assert_eq!(r.bytes, 0);
    r.on_fragment(t, 2, 0, 0, 1, b"", &mut ev, &mut n).unwrap();
    assert_eq!(
        ev.pop_front(),
        Some(Event::Message {
            channel: 2,
            data: Bytes::new()
        })
    );
}

/// A message whose fragments add up to more than `max_message_size` is refused at the
/// fragment that passes it (the bytes held are kept in the partial's cost, not summed).
#[test]
fn fragments_past_the_message_size_are_a_violation() {
    let cfg = Config {
        max_message_size: 2500,
        ..Config::default()
    };
    let mut r = Receiver::new(&cfg, Budget::unlimited());
    let (mut ev, mut n) = (VecDeque::new(), 0);
    let t = ricochet_testkit::SimClock::new().now();
    for index in 0..2 {
        r.on_fragment(t, 0, 0, index, 3, &[1u8; 1000], &mut ev, &mut n)
            .unwrap();
    }
    assert_eq!(
        r.on_fragment(t, 0, 0, 2, 3, &[1u8; 1000], &mut ev, &mut n),
        Err(DropCause::ProtocolViolation)
    );
    r.on_fragment(t, 0, 0, 2, 3, &[1u8; 500], &mut ev, &mut n)
        .unwrap();
    assert_eq!(
        ev.pop_front(),
        Some(Event::Message {
            channel: 0,
            data: Bytes::from([[1u8; 1000].as_slice(), &[1u8; 1000], &[1u8; 500]].concat())
        })
    );
}

#[test]
fn caps_refuse_without_losing_accounting() {
    let mut r = rx(100);
    let (mut ev, mut n) = (VecDeque::new(), 0);
    let t = ricochet_testkit::SimClock::new().now();
    assert_eq!(
        r.on_fragment(t, 2, 0, 0, 2, &[0u8; 200], &mut ev, &mut n),
        Err(DropCause::FlowControl)
    );
    assert!(r.bytes <= 100);
    assert!(!r.fits(&r.need(0, 7, 0, 2, 200), 0));
}

/// Small messages are cut from the arena one after another; once every message of a
/// chunk was dropped the chunk is reused, not reallocated; a kept message keeps its chunk
/// and its bytes; large messages and calls without an arena get their own allocation.
#[test]
fn small_messages_share_the_arena_and_a_dropped_chunk_is_reused() {
    let mut arena = BytesMut::new();
    let a = message_bytes(&[0; 32], Some(&mut arena));
    let b = message_bytes(&[1; 32], Some(&mut arena));
    let chunk = a.as_ptr();
    assert_eq!(b.as_ptr(), chunk.wrapping_add(32));
    drop((a, b));
    for i in 2..ARENA_CHUNK / 32 {
        drop(message_bytes(&[i as u8; 32], Some(&mut arena)));
    }
    // The chunk is full and every message from it dropped: the next one reuses it.
    let kept = message_bytes(b"kept", Some(&mut arena));
    assert_eq!(kept.as_ptr(), chunk);
    for i in 0..ARENA_CHUNK / 32 {
        drop(message_bytes(&[i as u8; 32], Some(&mut arena)));
    }
    // `kept` holds the first chunk: the arena moved on to another, `kept` is intact.
    let next = message_bytes(&[5; 32], Some(&mut arena));
    assert_ne!(next.as_ptr(), chunk);
    assert_eq!(&kept[..], b"kept");
    assert_eq!(&next[..], &[5; 32][..]);
    let big = message_bytes(&[1; ARENA_MAX_MESSAGE + 1], Some(&mut arena));
    assert_eq!(big.len(), ARENA_MAX_MESSAGE + 1);
    assert_eq!(&message_bytes(b"x", None)[..], b"x");
}
