"""Java properties parsing: the expected values are what java.util.Properties.load(Reader) returns."""

import pytest

from lmi_trt.properties import PropertiesSyntaxError, iter_properties, parse_properties


@pytest.mark.parametrize(
    "line",
    [
        "Truth = Beauty",
        "  Truth:Beauty",
        "Truth                    :Beauty",
        "Truth\t=\tBeauty",
        "Truth Beauty",
        "\f Truth=Beauty",
    ],
)
def test_separators_from_the_javadoc(line):
    assert parse_properties(line) == {"Truth": "Beauty"}


def test_continuation_lines_from_the_javadoc():
    text = (
        "fruits                           apple, banana, pear, \\\n"
        "                                 cantaloupe, watermelon, \\\n"
        "                                 kiwi, mango\n"
        "cheeses\n"
    )
    assert parse_properties(text) == {
        "fruits": "apple, banana, pear, cantaloupe, watermelon, kiwi, mango",
        "cheeses": "",
    }


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a=", {"a": ""}),
        ("a", {"a": ""}),
        ("a   ", {"a": ""}),
        ("a = = b", {"a": "= b"}),  # only one separator is consumed
        ("a : b : c", {"a": "b : c"}),
        ("a=b=c", {"a": "b=c"}),
        ("a=value with trailing space  ", {"a": "value with trailing space  "}),  # Java keeps trailing blanks
        ("=value", {"": "value"}),
        ("a=é ✓ 模型", {"a": "é ✓ 模型"}),
    ],
)
def test_key_value_split(text, expected):
    assert parse_properties(text) == expected


def test_comments_and_blank_lines():
    text = "# comment\n! also a comment\n   # indented comment\n\n   \n\t\na=1\nb=2 # not a comment\n"
    assert parse_properties(text) == {"a": "1", "b": "2 # not a comment"}


def test_a_comment_never_continues():
    assert parse_properties("# comment \\\na=1") == {"a": "1"}


def test_continuation_line_starting_with_hash_is_content():
    assert parse_properties("a=1\\\n  #2") == {"a": "1#2"}


def test_even_backslashes_do_not_continue():
    assert parse_properties("a=x\\\\\nb=y") == {"a": "x\\", "b": "y"}
    assert parse_properties("a=x\\\\\\\n  y") == {"a": "x\\y"}


def test_empty_continuation_line_ends_the_entry():
    assert parse_properties("a=1\\\n\nb=2") == {"a": "1", "b": "2"}
    assert parse_properties("a=1\\\n   \nb=2") == {"a": "1", "b": "2"}


def test_backslash_at_end_of_text_is_dropped():
    assert parse_properties("a=1\\") == {"a": "1"}
    assert parse_properties("a=1\\\n") == {"a": "1"}


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_line_endings(newline):
    text = newline.join(["a=1", "b=2\\", "   3", "# c=4", "d=5"])
    assert parse_properties(text) == {"a": "1", "b": "23", "d": "5"}


def test_only_java_line_breaks_split_lines():
    # \v, \x1c and \u2028 are line breaks to str.splitlines() but not to Java.
    assert parse_properties("a=1\x0b2\u2028x") == {"a": "1\x0b2\u2028x"}


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"a=tab\there", {"a": "tab\there"}),
        (r"a=line\nbreak\rreturn\ffeed", {"a": "line\nbreak\rreturn\ffeed"}),
        (r"a=back\\slash", {"a": "back\\slash"}),
        (r"a=caf\u00e9 \u00E9", {"a": "café é"}),
        (r"a=\q\w\#\!", {"a": "qw#!"}),  # any other escaped character stands for itself
        (r"a\=b=c", {"a=b": "c"}),
        (r"a\:b:c", {"a:b": "c"}),
        (r"a\ b c", {"a b": "c"}),
        (r"key=\ \ two leading spaces", {"key": "  two leading spaces"}),
        (r"\#notcomment=1", {"#notcomment": "1"}),
        (r"a=\ud83d\ude00", {"a": "😀"}),
    ],
)
def test_escapes(text, expected):
    assert parse_properties(text) == expected


@pytest.mark.parametrize("text", [r"a=\u12", r"a=\u12g4", "x=1\n" + r"a=\uzzzz"])
def test_malformed_unicode_escape_names_the_line(text):
    with pytest.raises(PropertiesSyntaxError, match=r"line \d+: malformed \\uXXXX") as info:
        parse_properties(text)
    assert isinstance(info.value, ValueError)
    assert f"line {text.count(chr(10)) + 1}" in str(info.value)


def test_unpaired_surrogate_is_an_error():
    with pytest.raises(PropertiesSyntaxError, match="surrogate"):
        parse_properties(r"a=\ud83d")


def test_duplicates_last_wins_and_iter_reports_lines():
    text = "a=1\nb=2\\\n  more\na=3\n"
    assert parse_properties(text) == {"a": "3", "b": "2more"}
    assert list(iter_properties(text)) == [(1, "a", "1"), (2, "b", "2more"), (4, "a", "3")]


def test_realistic_serving_properties():
    text = """
# LMI TensorRT-LLM
engine=MPI
option.model_id=s3://bucket/llama-3-8b/
option.tensor_parallel_degree = max
option.max_rolling_batch_size:64
option.chat_template={% for m in messages %}{{ m['content'] }}\\n{% endfor %}
"""
    assert parse_properties(text) == {
        "engine": "MPI",
        "option.model_id": "s3://bucket/llama-3-8b/",
        "option.tensor_parallel_degree": "max",
        "option.max_rolling_batch_size": "64",
        "option.chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
    }
