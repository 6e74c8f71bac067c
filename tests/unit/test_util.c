/* test_util.c - sizes, margins, byte formatting, SHA-256, suggestions. */
#include "unit.h"
#include "mmguard.h"

#include <string.h>

static uint64_t size_ok(const char *s)
{
    uint64_t v = 0;
    mm_error e;
    ck_assert_msg(mm_parse_size(s, &v, &e) == 0, "%s: %s", s, e.msg);
    return v;
}

START_TEST(sizes)
{
    ck_assert_uint_eq(size_ok("80GiB"), 80ull << 30);
    ck_assert_uint_eq(size_ok("80GB"), 80000000000ull);
    ck_assert_uint_eq(size_ok("81559MiB"), 81559ull << 20);
    ck_assert_uint_eq(size_ok("81559 mib"), 81559ull << 20);
    ck_assert_uint_eq(size_ok("512MB"), 512000000ull);
    ck_assert_uint_eq(size_ok("1.5GiB"), 3ull << 29);
    ck_assert_uint_eq(size_ok("123"), 123);
    ck_assert_uint_eq(size_ok("4KiB"), 4096);
    ck_assert_uint_eq(size_ok("2TiB"), 2ull << 40);
}
END_TEST

START_TEST(bad_sizes)
{
    const char *bad[] = {"", "GiB", "-1GiB", "80XB", "80 GiB extra", "1.GiB", "99999999999TiB",
                         "18446744073709551616", "nan", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 7;
        mm_error e = {{0}};
        ck_assert_msg(mm_parse_size(bad[i], &v, &e) != 0, "'%s' accepted", bad[i]);
        ck_assert_uint_eq(v, 7);
        ck_assert_msg(e.msg[0] != '\0', "no message for '%s'", bad[i]);
    }
}
END_TEST

START_TEST(margins)
{
    mm_margin m;
    mm_error e;
    ck_assert_int_eq(mm_parse_margin("10%", &m, &e), 0);
    ck_assert(m.percent == 10.0 && m.bytes == 0);
    ck_assert_uint_eq(mm_usable_bytes(100ull << 30, &m), 90ull << 30);
    ck_assert_int_eq(mm_parse_margin("4GiB", &m, &e), 0);
    ck_assert(m.percent == 0.0 && m.bytes == 4ull << 30);
    ck_assert_uint_eq(mm_usable_bytes(80ull << 30, &m), 76ull << 30);
    ck_assert_uint_eq(mm_usable_bytes(2ull << 30, &m), 0);
    ck_assert_int_ne(mm_parse_margin("100%", &m, &e), 0);
    ck_assert_int_ne(mm_parse_margin("-5%", &m, &e), 0);
    ck_assert_int_ne(mm_parse_margin("abc", &m, &e), 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "margin"));
    /* percentage rounds the cut up: never more usable than promised */
    ck_assert_int_eq(mm_parse_margin("33.3%", &m, &e), 0);
    ck_assert_uint_le(mm_usable_bytes(1000, &m), 667);
}
END_TEST

START_TEST(format)
{
    char b[32];
    mm_format_bytes(12, b, sizeof b);
    ck_assert_str_eq(b, "12 B");
    mm_format_bytes(3ull << 29, b, sizeof b);
    ck_assert_str_eq(b, "1.5 GiB");
    mm_format_bytes(UINT64_MAX, b, sizeof b);
    ck_assert_str_eq(b, "16.0 EiB");
}
END_TEST

START_TEST(sha256)
{
    char h[65];
    mm_sha256_hex("", 0, h);
    ck_assert_str_eq(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    mm_sha256_hex("abc", 3, h);
    ck_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    mm_sha256_hex(m, strlen(m), h);
    ck_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}
END_TEST

Suite *util_suite(void)
{
    Suite *s = suite_create("util");
    TCase *tc = tcase_create("util");
    tcase_add_test(tc, sizes);
    tcase_add_test(tc, bad_sizes);
    tcase_add_test(tc, margins);
    tcase_add_test(tc, format);
    tcase_add_test(tc, sha256);
    suite_add_tcase(s, tc);
    return s;
}
