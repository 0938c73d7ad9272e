-- Wireshark dissector for ulnic fabric packets (docs/spec.md §10.3).
--
-- `ulnic capture` writes pcap files of link type USER0 (147): every record
-- is one packet: its 64-byte header, its source route (route_len bytes,
-- one gate to leave by per switch) and its payload. Open one with
--   wireshark -X lua_script:tools/wireshark/ulnic.lua capture.pcap
--   tshark -X lua_script:tools/wireshark/ulnic.lua -r capture.pcap -V
-- or copy this file into Wireshark's personal plugins folder.
-- All fields are little endian.

local ulnic = Proto("ulnic", "ulnic fabric packet")

local kinds = {
  [1] = "DATA", [2] = "ACK", [3] = "NACK",
  [4] = "PROBE", [5] = "PROBE_REPLY", [6] = "ROUTES",
}
local tx_errors = {
  [1] = "NO_ENDPOINT", [2] = "NO_BUFFER", [3] = "REJECTED",
  [4] = "BUFFER_TOO_SMALL", [5] = "BAD_DESCRIPTOR", [6] = "BAD_ADDRESS",
  [7] = "NOT_BOUND", [8] = "BAD_COOKIE", [9] = "PERMISSION_DENIED",
  [10] = "OUT_OF_RANGE", [11] = "NO_TRANSLATION", [12] = "TOO_MANY_REDIRECTS",
  [13] = "UNREACHABLE",
}

local f = {
  magic        = ProtoField.uint16("ulnic.magic", "Magic", base.HEX),
  version      = ProtoField.uint16("ulnic.version", "Version"),
  kind         = ProtoField.uint16("ulnic.kind", "Kind", base.DEC, kinds),
  hop          = ProtoField.uint16("ulnic.hop", "Hop"),
  src_node     = ProtoField.uint32("ulnic.src_node", "Source node"),
  dst_node     = ProtoField.uint32("ulnic.dst_node", "Destination node"),
  src_endpoint = ProtoField.uint32("ulnic.src_endpoint", "Source endpoint"),
  src_port     = ProtoField.uint32("ulnic.src_port", "Source port"),
  dst_port     = ProtoField.uint32("ulnic.dst_port", "Destination port"),
  epoch        = ProtoField.uint32("ulnic.epoch", "Epoch"),
  seq          = ProtoField.uint32("ulnic.seq", "Sequence"),
  frag         = ProtoField.uint16("ulnic.frag", "Fragment"),
  frags        = ProtoField.uint16("ulnic.frags", "Fragments"),
  msg_len      = ProtoField.uint32("ulnic.msg_len", "Message length"),
  offset       = ProtoField.uint32("ulnic.offset", "Offset"),
  len          = ProtoField.uint32("ulnic.len", "Payload length"),
  tag          = ProtoField.uint32("ulnic.tag", "Tag", base.HEX),
  code         = ProtoField.uint16("ulnic.code", "Code", base.DEC, tx_errors),
  route_len    = ProtoField.uint16("ulnic.route_len", "Route length"),
  crc          = ProtoField.uint32("ulnic.crc", "CRC-32", base.HEX),
  route        = ProtoField.bytes("ulnic.route", "Route (gate per switch)", base.SPACE),
  payload      = ProtoField.bytes("ulnic.payload", "Payload"),
}
ulnic.fields = {
  f.magic, f.version, f.kind, f.hop, f.src_node, f.dst_node, f.src_endpoint,
  f.src_port, f.dst_port, f.epoch, f.seq, f.frag, f.frags, f.msg_len,
  f.offset, f.len, f.tag, f.code, f.route_len, f.crc, f.route, f.payload,
}

-- field, offset, size
local layout = {
  { f.magic, 0, 2 }, { f.version, 2, 2 }, { f.kind, 4, 2 }, { f.hop, 6, 2 },
  { f.src_node, 8, 4 }, { f.dst_node, 12, 4 }, { f.src_endpoint, 16, 4 },
  { f.src_port, 20, 4 }, { f.dst_port, 24, 4 }, { f.epoch, 28, 4 },
  { f.seq, 32, 4 }, { f.frag, 36, 2 }, { f.frags, 38, 2 },
  { f.msg_len, 40, 4 }, { f.offset, 44, 4 }, { f.len, 48, 4 },
  { f.tag, 52, 4 }, { f.code, 56, 2 }, { f.route_len, 58, 2 },
  { f.crc, 60, 4 },
}

local HEADER = 64

function ulnic.dissector(buf, pinfo, tree)
  if buf:len() < HEADER or buf(0, 2):le_uint() ~= 0x4c55 then
    return 0
  end
  pinfo.cols.protocol = "ulnic"
  local kind = buf(4, 2):le_uint()
  local src, dst = buf(8, 4):le_uint(), buf(12, 4):le_uint()
  local sport, dport = buf(20, 4):le_uint(), buf(24, 4):le_uint()
  local epoch, seq = buf(28, 4):le_uint(), buf(32, 4):le_uint()
  pinfo.cols.src = string.format("%d:%d", src, sport)
  pinfo.cols.dst = string.format("%d:%d", dst, dport)
  local info
  if kind == 1 then
    info = string.format("DATA ep %d epoch %d seq %d frag %d/%d len %d of %d tag 0x%x",
      buf(16, 4):le_uint(), epoch, seq, buf(36, 2):le_uint() + 1, buf(38, 2):le_uint(),
      buf(48, 4):le_uint(), buf(40, 4):le_uint(), buf(52, 4):le_uint())
  elseif kind == 2 then
    info = string.format("ACK ep %d epoch %d seq %d", buf(16, 4):le_uint(), epoch, seq)
  elseif kind == 3 then
    local code = buf(56, 2):le_uint()
    info = string.format("NACK ep %d epoch %d seq %d %s", buf(16, 4):le_uint(), epoch, seq,
      tx_errors[code] or tostring(code))
  elseif kind == 4 then
    info = string.format("PROBE id %d round %d", seq, epoch)
  elseif kind == 5 then
    info = string.format("PROBE_REPLY id %d round %d", seq, epoch)
  elseif kind == 6 then
    info = string.format("ROUTES generation %d for node %d", seq, dst)
  else
    info = string.format("kind %d", kind)
  end
  pinfo.cols.info = info
  local route_len = math.min(buf(58, 2):le_uint(), buf:len() - HEADER)
  local body = HEADER + route_len
  local t = tree:add(ulnic, buf(0, math.min(buf:len(), body + buf(48, 4):le_uint())), "ulnic " .. info)
  for _, e in ipairs(layout) do
    t:add_le(e[1], buf(e[2], e[3]))
  end
  if route_len > 0 then
    t:add(f.route, buf(HEADER, route_len))
  end
  if buf:len() > body then
    t:add(f.payload, buf(body))
  end
  return buf:len()
end

local user_encap = DissectorTable.get("wtap_encap")
user_encap:add(wtap.USER0, ulnic)
