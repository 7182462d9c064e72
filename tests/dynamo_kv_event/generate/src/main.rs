// Mirrors the serde shape of Dynamo's RouterEvent (lib/kv-router/src/protocols.rs
// at commit cfa22544b95be056ab4f4b9b9e1762d8b56f6e59) and EventEnvelope
// (lib/runtime/src/transports/event_plane/traits.rs at 331ac67b...), and prints
// rmp_serde::to_vec_named / serde_json::to_string of each fixture.
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq)]
struct LocalBlockHash(u64);
#[derive(Debug, Clone, Copy, PartialEq)]
struct ExternalSequenceBlockHash(u64);
impl Serialize for LocalBlockHash { fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> { s.serialize_u64(self.0) } }
impl<'de> Deserialize<'de> for LocalBlockHash { fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> { Ok(Self(u64::deserialize(d)?)) } }
impl Serialize for ExternalSequenceBlockHash { fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> { s.serialize_u64(self.0) } }
impl<'de> Deserialize<'de> for ExternalSequenceBlockHash { fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> { Ok(Self(u64::deserialize(d)?)) } }

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct BlockMmObjectInfo { mm_hash: u64, offsets: Vec<(usize, usize)> }
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct BlockExtraInfo { mm_objects: Vec<BlockMmObjectInfo> }
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct KvCacheStoredBlockData { block_hash: ExternalSequenceBlockHash, tokens_hash: LocalBlockHash, #[serde(default)] mm_extra_info: Option<BlockExtraInfo> }
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct KvCacheStoreData { parent_hash: Option<ExternalSequenceBlockHash>, blocks: Vec<KvCacheStoredBlockData> }
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct KvCacheRemoveData { block_hashes: Vec<ExternalSequenceBlockHash> }
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
enum KvCacheEventData { Stored(KvCacheStoreData), Removed(KvCacheRemoveData), Cleared }
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct KvCacheEvent { event_id: u64, data: KvCacheEventData, #[serde(default)] dp_rank: u32 }
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct RouterEvent { worker_id: u64, event: KvCacheEvent }

mod bytes_serde {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(b: &Vec<u8>, s: S) -> Result<S::Ok, S::Error> { s.serialize_bytes(b) }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> { Vec::<u8>::deserialize(d) }
}
#[derive(Debug, Clone, Serialize, Deserialize)]
struct EventEnvelope { topic: String, publisher_id: u64, sequence: u64, published_at: u64, #[serde(with = "bytes_serde")] payload: Vec<u8> }

fn hex(b: &[u8]) -> String { b.iter().map(|x| format!("{:02x}", x)).collect() }

fn show(name: &str, ev: &RouterEvent) {
    let mp = rmp_serde::to_vec_named(ev).unwrap();
    let js = serde_json::to_string(ev).unwrap();
    println!("{} msgpack {}", name, hex(&mp));
    println!("{} json {}", name, js);
    let back: RouterEvent = rmp_serde::from_slice(&mp).unwrap();
    assert_eq!(&back, ev);
    let back2: RouterEvent = serde_json::from_str(&js).unwrap();
    assert_eq!(&back2, ev);
}

fn try_mp(name: &str, b: &[u8]) {
    let r: Result<RouterEvent, _> = rmp_serde::from_slice(b);
    println!("mp-decode {}: {:?}", name, r.map(|e| format!("{:?}", e)).map_err(|e| e.to_string()));
}
fn try_js(name: &str, s: &str) {
    let r: Result<RouterEvent, _> = serde_json::from_str(s);
    println!("js-decode {}: {:?}", name, r.map(|e| format!("{:?}", e)).map_err(|e| e.to_string()));
}

fn main() {
    let h1 = 0xF3A5_1C2B_9D87_E601u64; // > 2^53
    let t1 = 0x9E37_79B9_7F4A_7C15u64;
    let h2 = 0x8000_0000_0000_0001u64;
    let t2 = 0x0020_0000_0000_0001u64; // 2^53 + 1
    let stored = RouterEvent { worker_id: 0xDEAD_BEEF_CAFE_F00Du64, event: KvCacheEvent { event_id: 42, dp_rank: 3, data: KvCacheEventData::Stored(KvCacheStoreData { parent_hash: Some(ExternalSequenceBlockHash(u64::MAX)), blocks: vec![
        KvCacheStoredBlockData { block_hash: ExternalSequenceBlockHash(h1), tokens_hash: LocalBlockHash(t1), mm_extra_info: None },
        KvCacheStoredBlockData { block_hash: ExternalSequenceBlockHash(h2), tokens_hash: LocalBlockHash(t2), mm_extra_info: None } ] }) } };
    show("stored", &stored);
    let root = RouterEvent { worker_id: 7, event: KvCacheEvent { event_id: 0, dp_rank: 0, data: KvCacheEventData::Stored(KvCacheStoreData { parent_hash: None, blocks: vec![
        KvCacheStoredBlockData { block_hash: ExternalSequenceBlockHash(1), tokens_hash: LocalBlockHash(200), mm_extra_info: None } ] }) } };
    show("stored_root", &root);
    let removed = RouterEvent { worker_id: 7, event: KvCacheEvent { event_id: 9_007_199_254_740_993, dp_rank: 0xFFFF_FFFF, data: KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: vec![ExternalSequenceBlockHash(h1), ExternalSequenceBlockHash(127), ExternalSequenceBlockHash(128), ExternalSequenceBlockHash(65536)] }) } };
    show("removed", &removed);
    let cleared = RouterEvent { worker_id: 1, event: KvCacheEvent { event_id: 5, dp_rank: 0, data: KvCacheEventData::Cleared } };
    show("cleared", &cleared);
    let mm = RouterEvent { worker_id: 2, event: KvCacheEvent { event_id: 1, dp_rank: 0, data: KvCacheEventData::Stored(KvCacheStoreData { parent_hash: None, blocks: vec![
        KvCacheStoredBlockData { block_hash: ExternalSequenceBlockHash(10), tokens_hash: LocalBlockHash(11), mm_extra_info: Some(BlockExtraInfo { mm_objects: vec![BlockMmObjectInfo { mm_hash: h1, offsets: vec![(0, 16)] }] }) } ] }) } };
    show("stored_mm", &mm);

    let payload = rmp_serde::to_vec_named(&cleared).unwrap();
    let env = EventEnvelope { topic: "kv-events".into(), publisher_id: 0x0012_3456_789A_BCDE, sequence: 17, published_at: 1_700_000_000_000, payload };
    let eb = rmp_serde::to_vec_named(&env).unwrap();
    println!("envelope msgpack {}", hex(&eb));
    let back: Result<EventEnvelope, _> = rmp_serde::from_slice(&eb); println!("envelope decode with rmp-serde 1.1.1: {:?}", back.map(|_| ()).map_err(|e| e.to_string()));


    // Deserializer behaviour on edge inputs.
    try_js("unknown_key", r#"{"worker_id":1,"extra":[1,{"a":2}],"event":{"event_id":5,"data":"cleared"}}"#);
    try_js("dup_key", r#"{"worker_id":1,"worker_id":2,"event":{"event_id":5,"data":"cleared"}}"#);
    try_js("positional", r#"[1,[5,"cleared",2]]"#);
    try_js("positional_short", r#"[1,[5,"cleared"]]"#);
    try_js("positional_long", r#"[1,[5,"cleared",2,9]]"#);
    try_js("float_hash", r#"{"worker_id":1,"event":{"event_id":5,"data":{"removed":{"block_hashes":[1.0]}}}}"#);
    try_js("neg_hash", r#"{"worker_id":1,"event":{"event_id":5,"data":{"removed":{"block_hashes":[-1]}}}}"#);
    try_js("big_hash", r#"{"worker_id":1,"event":{"event_id":5,"data":{"removed":{"block_hashes":[18446744073709551616]}}}}"#);
    try_js("cleared_map_null", r#"{"worker_id":1,"event":{"event_id":5,"data":{"cleared":null}}}"#);
    try_js("stored_as_string", r#"{"worker_id":1,"event":{"event_id":5,"data":"stored"}}"#);
    try_js("unknown_variant", r#"{"worker_id":1,"event":{"event_id":5,"data":"flushed"}}"#);
    try_js("two_variants", r#"{"worker_id":1,"event":{"event_id":5,"data":{"cleared":null,"removed":{"block_hashes":[]}}}}"#);
    try_js("no_parent_key", r#"{"worker_id":1,"event":{"event_id":5,"data":{"stored":{"blocks":[]}}}}"#);
    try_js("no_blocks", r#"{"worker_id":1,"event":{"event_id":5,"data":{"stored":{"parent_hash":null}}}}"#);
    try_js("escaped_key", r#"{"worker_\u0069d":1,"event":{"event_id":5,"data":"cleared"}}"#);
    try_js("trailing_ws", "{\"worker_id\":1,\"event\":{\"event_id\":5,\"data\":\"cleared\"}} \n");
    try_js("dp_rank_big", r#"{"worker_id":1,"event":{"event_id":5,"data":"cleared","dp_rank":4294967296}}"#);
    try_js("dp_rank_null", r#"{"worker_id":1,"event":{"event_id":5,"data":"cleared","dp_rank":null}}"#);
    try_js("parent_float", r#"{"worker_id":1,"event":{"event_id":5,"data":{"stored":{"parent_hash":2.5,"blocks":[]}}}}"#);
    try_js("int_key", r#"{"worker_id":1,"event":{"event_id":5,"data":"cleared"},"0":3}"#);
    let mut tr = rmp_serde::to_vec_named(&cleared).unwrap();
    tr.push(0xc0);
    try_mp("trailing_byte", &tr);
    // {"worker_id": int64 0xd3 positive, ...}
    let mut m = vec![0x82, 0xa9]; m.extend_from_slice(b"worker_id"); m.extend_from_slice(&[0xd3, 0,0,0,0,0,0,0,1]);
    m.push(0xa5); m.extend_from_slice(b"event"); m.extend_from_slice(&[0x82, 0xa8]); m.extend_from_slice(b"event_id"); m.push(5); m.push(0xa4); m.extend_from_slice(b"data"); m.push(0xa7); m.extend_from_slice(b"cleared");
    try_mp("int64_positive", &m);
    let mut m2 = m.clone(); m2[11] = 0xd0; m2.truncate(12); m2[11]=0xff; // worker_id: int8 -1 (rebuild below)
    let mut n = vec![0x82, 0xa9]; n.extend_from_slice(b"worker_id"); n.extend_from_slice(&[0xd0, 0xff]); n.extend_from_slice(&m[20..]);
    try_mp("negative", &n);
    let mut f = vec![0x82, 0xa9]; f.extend_from_slice(b"worker_id"); f.extend_from_slice(&[0xcb, 0x3f,0xf0,0,0,0,0,0,0]); f.extend_from_slice(&m[20..]);
    try_mp("float", &f);
    // positional msgpack [1, [5, "cleared", 0]]
    let p = rmp_serde::to_vec(&cleared).unwrap();
    println!("positional msgpack {}", hex(&p));
    try_mp("positional", &p);
    // bin keys
    let mut b = vec![0x82, 0xc4, 9]; b.extend_from_slice(b"worker_id"); b.push(1); b.extend_from_slice(&m[20..]);
    try_mp("bin_key", &b);
    let _ = m2;
}
