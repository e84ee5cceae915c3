// UTF-8 text to bytes and back, without TextEncoder/TextDecoder: StarlingMonkey has them,
// QuickJS (componentize-qjs) does not, and the SDK runs on both. Malformed input decodes to
// U+FFFD, as TextDecoder does.

/** `text` as UTF-8 bytes. */
export function encodeUtf8(text) {
  const out = [];
  for (const char of text) {
    const c = char.codePointAt(0);
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 0x3f));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 0x3f), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
  }
  return Uint8Array.from(out);
}

/** `bytes` (UTF-8) as text, by the WHATWG Encoding Standard's UTF-8 decoder. */
export function decodeUtf8(bytes) {
  let text = '';
  let codePoint = 0;
  let needed = 0;
  let seen = 0;
  let lower = 0x80;
  let upper = 0xbf;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (needed === 0) {
      if (b <= 0x7f) text += String.fromCharCode(b);
      else if (b >= 0xc2 && b <= 0xdf) [needed, codePoint] = [1, b & 0x1f];
      else if (b >= 0xe0 && b <= 0xef) {
        if (b === 0xe0) lower = 0xa0;
        if (b === 0xed) upper = 0x9f;
        [needed, codePoint] = [2, b & 0x0f];
      } else if (b >= 0xf0 && b <= 0xf4) {
        if (b === 0xf0) lower = 0x90;
        if (b === 0xf4) upper = 0x8f;
        [needed, codePoint] = [3, b & 0x07];
      } else text += '\ufffd';
      continue;
    }
    if (b < lower || b > upper) {
      // A broken sequence is one U+FFFD; the byte that broke it starts afresh.
      [codePoint, needed, seen, lower, upper] = [0, 0, 0, 0x80, 0xbf];
      text += '\ufffd';
      i--;
      continue;
    }
    [lower, upper] = [0x80, 0xbf];
    codePoint = (codePoint << 6) | (b & 0x3f);
    seen++;
    if (seen === needed) {
      text += String.fromCodePoint(codePoint);
      [codePoint, needed, seen] = [0, 0, 0];
    }
  }
  return needed > 0 ? `${text}\ufffd` : text;
}
